"""A synthetic ReXVQA study's questions: worded for its report, each of one task, its options all of one kind and
its answer at a uniformly random letter, so that the text alone tells no more than chance.

The task of each question is drawn by weight (`task_weights`) among those the study's findings can be asked.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from dataclasses import dataclass

from rexvqa_dataset.features import TASKS
from rexvqa_dataset.synthetic.drawing import StudyFinding
from rexvqa_dataset.synthetic.profile import FINDINGS, FINDINGS_PER_STUDY, LUNG_ZONES, SIZES, TASK_SHARES, FindingKind

PRESENCE, LOCATION, NEGATION, DIFFERENTIAL, GEOMETRIC = TASKS
QUESTIONS = {
    PRESENCE: (
        "Which of the following findings is present{where}?",
        "Which finding can be seen{where}?",
        "Which of these abnormalities is visible{where}?",
        "Which of the following is demonstrated{where}?",
        "What abnormality is identified{where}?",
        "Which of the following findings does the study show{where}?",
    ),
    LOCATION: (
        "Where is the {finding} located{where}?",
        "In which lung zone is the {finding} seen{where}?",
        "What is the location of the {finding}{where}?",
        "Which zone does the {finding} project over{where}?",
        "Where does the {finding} lie{where}?",
    ),
    NEGATION: (
        "Which of the following findings is NOT present{where}?",
        "Which finding is NOT seen{where}?",
        "All of the following are visible{where} EXCEPT:",
        "Which of these is absent{where}?",
        "Which of the following can be excluded{where}?",
    ),
    DIFFERENTIAL: (
        "What is the most likely diagnosis given the imaging findings{where}?",
        "Which diagnosis best explains the findings{where}?",
        "Which condition is most likely{where}?",
        "What is the leading diagnosis based on the findings{where}?",
        "Which diagnosis do the findings{where} favor?",
    ),
    GEOMETRIC: (
        "What is the size of the {finding}{where}?",
        "How large is the {finding}{where}?",
        "How would you grade the extent of the {finding}{where}?",
        "What is the extent of the {finding}{where}?",
    ),
}
"""chosen: plausible. Several wordings per task; none names or hints at the answer. `{where}` names the
images where no opening sentence does; `{finding}` is the finding asked about."""
WHERE = (
    " on this chest radiograph",
    " on this chest X-ray",
    " on the radiograph",
    " on these images",
    " in this study",
)
VIEW_NAMES = {"PA": "PA", "AP": "AP", "LATERAL": "lateral", "LL": "left lateral"}
AGE_UNITS = {"Y": "year", "M": "month", "W": "week", "D": "day"}


def _views_phrase(views: list[str | None]) -> str:
    """`PA and lateral radiographs`, `AP radiograph`, `radiographs`: the study's named views."""
    named = list(dict.fromkeys(VIEW_NAMES[v] for v in views if v in VIEW_NAMES))
    noun = "radiographs" if len(views) > 1 else "radiograph"
    return f"{' and '.join(named)} {noun}" if named else noun


def _patient(study: dict) -> str:
    """`a 67-year-old woman`, `a 5-month-old boy`: from the study's age and sex."""
    age = study["PatientAge"]
    number, unit = int(age[:-1]), AGE_UNITS[age[-1]]
    adult = unit == "year"
    who = {"M": "man" if adult else "boy", "F": "woman" if adult else "girl"}[study["PatientSex"]]
    article = "an" if str(number).startswith("8") or number in (11, 18) else "a"
    return f"{article} {number}-{unit}-old {who}"


def _complaint(study: dict) -> str | None:
    """The indication as a complaint (`cough`, `fever`), or None where the study has none."""
    text = study["Indication"]
    return text.split(",")[0].rstrip(".").lower() if isinstance(text, str) else None


def question_wording(rng: random.Random, task: str, study: dict) -> str:
    """A question of `task` as written for this study's report: the core wording, opened (or not) by the
    views, the patient and the complaint (which say nothing of the answer); `{finding}` left to fill."""
    core = rng.choice(QUESTIONS[task])
    complaint = _complaint(study)
    form = rng.random()
    if form < 0.3:
        return core.replace("{where}", rng.choice(WHERE))
    if form < 0.7:
        opening = f"On the {_views_phrase(study['ImageViewPosition'] or [None] * len(study['ImagePath']))} of {_patient(study)}"
        opening += f" with {complaint}, " if complaint else ", "
        return opening + core[0].lower() + core[1:].replace("{where}", "")
    first = (
        f"{_capital(_patient(study))} presents with {complaint}."
        if complaint
        else f"{_capital(_patient(study))} is referred for imaging."
    )
    return first + " " + core.replace("{where}", rng.choice(WHERE))


ASKABLE: dict[str, Callable[[FindingKind], bool]] = {
    PRESENCE: lambda kind: True,
    LOCATION: lambda kind: kind.where == "zone",
    NEGATION: lambda kind: True,
    DIFFERENTIAL: lambda kind: kind.diagnosis is not None,
    GEOMETRIC: lambda kind: kind.sized,
}
"""Which present findings a question of each task can be about (presence and negation: any)."""


def _chance_askable(task: str) -> float:
    """The chance that a study has a finding a `task` question can be about (negation: three findings, always)."""
    eligible = sum(ASKABLE[task](kind) for kind in FINDINGS)
    return sum(
        weight * (1 - math.comb(len(FINDINGS) - eligible, count) / math.comb(len(FINDINGS), count))
        for count, weight in FINDINGS_PER_STUDY.items()
    )


def task_weights(shares: dict[str, float]) -> dict[str, float]:
    """Each task's share divided by the chance a study can be asked it, so that over the release each
    task keeps its share although some studies cannot be asked some tasks."""
    return {task: share / _chance_askable(task) for task, share in shares.items()}


TASK_WEIGHTS = task_weights(TASK_SHARES)


def _capital(text: str) -> str:
    return text[0].upper() + text[1:]


@dataclass
class Question:
    task: str
    question: str
    options: list[str]
    answer: int
    explanation: str
    topic: FindingKind
    """The finding whose category and subcategory the question is filed under."""
    shows: tuple[FindingKind, ...] = ()
    """The study's findings that make the answer right, as the images show them: the present option of a
    presence question, the three present options of a negation question, the finding a differential,
    location or size question is about."""


def ask(rng: random.Random, task: str, findings: list[StudyFinding], study: dict) -> Question:
    """One question of `task` about the study's `findings`, its answer at a uniformly random letter.

    Every option is of one kind (four finding names, four diagnoses, four zones, four sizes), each
    equally likely to be the answer, so that the text alone tells no more than chance. Presence and
    negation questions, whose options are findings, are filed under a uniformly chosen option's
    finding: their category and subcategory point at the answer one time in four, as any option does.
    """
    wording = question_wording(rng, task, study)
    present = [f.kind for f in findings]
    absent = [kind for kind in FINDINGS if kind not in present]
    if task in (PRESENCE, NEGATION):
        return _ask_presence(rng, task, wording, present, absent)
    about = rng.choice([f for f in findings if ASKABLE[task](f.kind)])
    if task == DIFFERENTIAL:
        others = [k.diagnosis for k in absent if k.diagnosis is not None]
        choices = _shuffled(rng, about.kind.diagnosis, rng.sample(others, 3))
        filed_under = rng.choice(choices)
        filed = next(k for k in FINDINGS if k.diagnosis == filed_under)
        return Question(
            task,
            wording,
            choices,
            choices.index(about.kind.diagnosis),
            f"{about.phrase()[:-1]}, which points to {about.kind.diagnosis.lower()}.",
            filed,
            (about.kind,),
        )
    if task == LOCATION:
        choices = _shuffled(rng, about.place, rng.sample([z for z in LUNG_ZONES if z != about.place], 3))
        return Question(
            task,
            wording.format(finding=about.kind.name),
            [_capital(z) for z in choices],
            choices.index(about.place),
            f"The {about.kind.name} projects over the {about.place}.",
            about.kind,
            (about.kind,),
        )
    size = SIZES[about.size]
    choices = _shuffled(rng, size, [s for s in SIZES if s != size])
    return Question(
        task,
        wording.format(finding=about.kind.name),
        choices,
        choices.index(size),
        f"The {about.kind.name} is {size.lower()} in extent.",
        about.kind,
        (about.kind,),
    )


def _ask_presence(
    rng: random.Random, task: str, wording: str, present: list[FindingKind], absent: list[FindingKind]
) -> Question:
    """A presence question (one present finding among three absent) or a negation one (the reverse)."""
    yes, no = (present, absent) if task == PRESENCE else (absent, present)
    right, wrong = rng.choice(yes), rng.sample(no, 3)
    kinds = _shuffled(rng, right, wrong)
    options, answer = [_capital(k.name) for k in kinds], kinds.index(right)
    if task == PRESENCE:
        explanation = f"The radiograph shows {right.name}; {', '.join(k.name for k in wrong)} are not seen."
    else:
        explanation = f"{_capital(', '.join(k.name for k in wrong))} are seen; {right.name} is not."
    shows = (right,) if task == PRESENCE else tuple(wrong)
    return Question(task, wording, options, answer, explanation, rng.choice(kinds), shows)


def _shuffled(rng: random.Random, right: object, wrong: list) -> list:
    options = list(wrong)
    options.insert(rng.randrange(len(options) + 1), right)
    return options


def pick_task(rng: random.Random, findings: list[StudyFinding], weights: dict[str, float]) -> str:
    askable = [t for t in TASKS if any(ASKABLE[t](f.kind) for f in findings)]
    return rng.choices(askable, weights=[weights[t] for t in askable])[0]

"""An image's synthetic questions, and the findings they make the image show.

Each question is worded first, from the release's distributions alone; its answer is then drawn
from the answer prior (or read from what the image already shows), and the findings it needs are
added to the image's `Findings`. The image is drawn from those findings, so the answer lives in the
pixels and not in the wording: the correct option's place, length and text are independent of it.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from gemex_dataset.synthetic.distributions import (
    ASK_AGAIN_SHARE,
    CLOSED_ASK_PRESENT,
    CONTENT_TYPE_SHARES,
    CONTENT_TYPES_BY_QUESTION,
    CONTEXTS,
    DESCRIPTORS,
    FINDING_BY_NAME,
    FINDINGS,
    HEALTHY_SHARE,
    LEADS,
    MULTI_CORRECT,
    NEGATION_OPTION_SHARE,
    PLURAL_FINDINGS,
    REGION_SHARES,
    SECOND_BOX_SHARE,
    SEVERITIES,
    SINGLE_FOUR_OPTIONS,
    SIZED,
    SIZES_CM,
    TAILS,
    UNGRADED_KINDS,
)


@dataclass(frozen=True)
class Shown:
    """One finding drawn into the image."""

    finding: str
    region: str
    severity: str
    size_cm: float


LEVELS = {
    "lung": ("upper", "mid", "lower"),
    "upper lung zone": ("upper",),
    "mid lung zone": ("mid",),
    "lower lung zone": ("lower",),
    "mid-to-lower lung zone": ("mid", "lower"),
    "mid-to-upper lung zone": ("upper", "mid"),
}


def region_cells(region: str) -> frozenset[tuple[str, ...]]:
    """The parts of the chest a region covers: a lung region its (side, level) thirds, a paired structure its
    sides, any other region itself. One region lies within another when its cells are a subset."""
    side, _, rest = region.partition(" ")
    if side not in ("right", "left", "bilateral"):
        return frozenset({(region,)})
    sides = ("right", "left") if side == "bilateral" else (side,)
    if rest in LEVELS:
        return frozenset((s, level) for s in sides for level in LEVELS[rest])
    return frozenset((s, rest) for s in sides)


def within(part: str, whole: str) -> bool:
    return region_cells(part) <= region_cells(whole)


@dataclass
class Findings:
    """What an image shows: each (finding, region) decided once, present (`Shown`) or absent (None).

    Decisions about one finding never contradict each other: it is not said absent from a region
    that holds a part where it shows ("the bilateral lung does not show X" beside "the right upper
    lung zone shows X"), whatever the question asking wanted.
    """

    healthy: bool
    decided: dict[tuple[str, str], Shown | None] = field(default_factory=dict)

    @property
    def shown(self) -> list[Shown]:
        return [s for s in self.decided.values() if s is not None]

    def decide(
        self,
        finding: str,
        region: str,
        present: bool,
        rng: random.Random,
        severity: str | None = None,
        size_cm: float | None = None,
    ) -> Shown | None:
        """Whether `finding` shows in `region`: as decided before; else present where it shows in a part of
        the region, absent where it was said absent from a region holding this one, otherwise as asked
        (never on a healthy image)."""
        key = (finding, region)
        if key not in self.decided:
            same = [(r, s) for (f, r), s in self.decided.items() if f == finding]
            if any(s is not None and within(r, region) for r, s in same):
                present = True
            if any(s is None and within(region, r) for r, s in same):
                present = False
            self.decided[key] = (
                Shown(finding, region, severity or rng.choice(SEVERITIES), size_cm or rng.choice(SIZES_CM))
                if present and not self.healthy
                else None
            )
        return self.decided[key]

    def at(self, region: str) -> list[Shown]:
        """The findings shown in `region` or in a part of it."""
        return [s for s in self.shown if within(s.region, region)]


def _pick(rng: random.Random, shares: dict[str, float]) -> str:
    return rng.choices(list(shares), weights=list(shares.values()))[0]


def pick_region(rng: random.Random) -> str:
    return _pick(rng, REGION_SHARES)


def findings_at(region: str) -> list[str]:
    return [f.name for f in FINDINGS if region in f.regions]


def graded(finding: str) -> bool:
    return FINDING_BY_NAME[finding].kind not in UNGRADED_KINDS


def pick_pair(rng: random.Random, graded_only: bool = False) -> tuple[str, str]:
    """A (finding, region) to ask about: the region by its share, a finding that can sit there."""
    while True:
        region = pick_region(rng)
        names = [f for f in findings_at(region) if graded(f) or not graded_only]
        if names:
            return rng.choice(names), region


def content_type(rng: random.Random, qtype: str) -> str:
    return _pick(rng, {t: CONTENT_TYPE_SHARES[t] for t in CONTENT_TYPES_BY_QUESTION[qtype]})


def plural(name: str) -> bool:
    """Whether a finding or region name takes a plural verb ("surgical clips are", "hilar structures show")."""
    return name in PLURAL_FINDINGS or name.endswith("structures")


def be(name: str) -> str:
    return "are" if plural(name) else "is"


def does(name: str) -> str:
    return "do" if plural(name) else "does"


def _and(items: list[str]) -> str:
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


def shows(region: str, negated: bool = False) -> str:
    """`the <region> shows` / `show` / `does not show` / `do not show`, agreeing with the region."""
    if negated:
        return f"the {region} {'do' if plural(region) else 'does'} not show"
    return f"the {region} {'show' if plural(region) else 'shows'}"


def _phrase(rng: random.Random, core: str) -> str:
    """The question: the image named once (an opening or a closing, or neither) and a clinical setting."""
    where = rng.random()
    text = (
        (rng.choice(LEADS) if where < 0.45 else "")
        + core
        + (rng.choice(TAILS) if where > 0.6 else "")
        + rng.choice(CONTEXTS)
        + "?"
    )
    return text[0].upper() + text[1:]


def _boxes(rng: random.Random, regions: list[str]) -> list[str]:
    if len(regions) == 1 and rng.random() < SECOND_BOX_SHARE:
        regions = regions + [rng.choice([r for r in REGION_SHARES if r != regions[0]])]
    return regions


def _letters(options: list[str]) -> list[str]:
    return [f"{chr(65 + i)}: {o[0].upper()}{o[1:]}" for i, o in enumerate(options)]


EVIDENCE = {
    "opacity": (
        "increased density over {extent} of it",
        "airspace density over {extent} of it",
        "patchy opacity over {extent} of it",
        "opacity over {extent} of it",
        "haze over {extent} of it",
    ),
    "nodule": (
        "a round {size} cm density with sharp margins",
        "a well-defined {size} cm nodule",
        "a discrete {size} cm rounded opacity",
        "a solitary {size} cm rounded density",
        "a {size} cm circumscribed opacity",
    ),
    "effusion": (
        "blunting of the costophrenic angle with a meniscus",
        "dependent fluid density with a meniscus",
        "a layering density filling {extent} of the base",
        "a basal meniscus",
        "fluid at the base",
    ),
    "pneumothorax": (
        "a visceral pleural line with no lung markings beyond it",
        "a lucent rim without vessels at the apex",
        "a thin pleural line and absent markings above it",
        "a sharp pleural edge",
        "an apical lucency",
    ),
    "line": (
        "a linear radiopaque device along its expected course",
        "a tubular radiopaque line in the expected position",
        "a thin dense line projecting over it",
        "a radiopaque line",
        "a dense tubular shadow",
    ),
    "clips": (
        "small metallic densities",
        "several radiopaque clips",
        "clustered metallic clips",
        "a few bright metallic clips",
        "tiny angular metallic densities",
    ),
    "heart": (
        "a cardiac silhouette wider than expected",
        "an enlarged cardiac silhouette",
        "a broadened heart shadow",
        "a heart border reaching far laterally",
        "a widened cardiac contour",
    ),
    "hilum": (
        "prominent, dense hilar shadows",
        "enlarged hilar contours",
        "bulky hilar opacities",
        "lobulated hilar densities",
        "full, dense hila",
    ),
    "dome": (
        "a dome higher than the other side",
        "an elevated diaphragmatic contour",
        "a raised hemidiaphragm outline",
        "a diaphragm dome sitting high",
        "an upward bulge of the dome",
    ),
    "spots": (
        "bright marginal densities along the vertebrae",
        "osteophytes at several levels",
        "endplate sclerosis and spurring",
        "bony spurs at the vertebral margins",
        "marginal vertebral osteophytes",
    ),
    "widening": (
        "a mediastinal shadow wider than normal",
        "a broadened superior mediastinum",
        "widening of the mediastinal contour",
        "a mediastinum broader than expected",
        "a widened central shadow",
    ),
}
"""chosen: plausible. What a reader sees of each drawn kind; {extent} and {size} from the finding itself."""
EXTENT_WORDS = {"mild": "about a third", "moderate": "over half", "severe": "nearly all"}
NORMAL = (
    "it is clear",
    "its contour is normal",
    "its density is as expected",
    "nothing abnormal projects over it",
    "it looks unremarkable",
    "no focal change is seen there",
    "it appears within normal limits",
    "its markings are normal",
    "no abnormal density is seen",
    "its appearance is normal",
)
"""chosen: plausible. What a reason says of a region without the finding asked about."""
CLOSINGS = (
    "",
    "",
    "",
    "",
    "",
    "",
    ", in keeping with {implication}",
    ", suggesting {implication}",
    ", typical of {implication}",
)


def evidence(rng: random.Random, shown: Shown) -> str:
    kind = FINDING_BY_NAME[shown.finding].kind
    return rng.choice(EVIDENCE[kind]).format(extent=EXTENT_WORDS[shown.severity], size=shown.size_cm)


def _fit(text: str, extra: str) -> str:
    """`text` + `extra`, as long as that stays under 150 characters; a reason ends with a full stop."""
    whole = text + extra
    return (whole if len(whole) <= 149 else text) + "."


def present_reason(rng: random.Random, shown: Shown, region: str) -> str:
    """Why a question's answer says `shown` is there: what the film shows of it in `region`, and what it suggests."""
    f = FINDING_BY_NAME[shown.finding]
    opening = rng.choice(
        (
            f"{shows(region).capitalize()} {described(shown)}",
            f"{described(shown).capitalize()} {'are' if plural(shown.finding) else 'is'} seen in the {region}",
            f"There {'are' if plural(shown.finding) else 'is'} {described(shown)} in the {region}",
            f"The film shows {described(shown)} in the {region}",
            f"In the {region}: {described(shown)}",
        )
    )
    text = f"{opening}: {evidence(rng, shown)}"
    return _fit(text, rng.choice(CLOSINGS).format(implication=f.implication))


def absent_reason(rng: random.Random, finding: str, region: str, severity: str | None = None) -> str:
    """Why a question's answer says `finding` (of `severity`, if given) is not in `region`."""
    what = f"{severity} {finding}" if severity else finding
    text = rng.choice(
        (
            f"{shows(region, negated=True).capitalize()} {what}; {rng.choice(NORMAL)}",
            f"No {what} {'are' if plural(finding) else 'is'} seen in the {region}, where {rng.choice(NORMAL)}",
            f"There is no sign of {what} in the {region}: {rng.choice(NORMAL)}",
        )
    )
    return _fit(text, rng.choice(("", "", " here")))


def healthy_reason(rng: random.Random, region: str, whole_film: bool) -> str:
    """Why a region is answered normal; `whole_film`: the image has no finding anywhere."""
    closing = (
        rng.choice(
            (
                " and the rest of the film is clear",
                ", as is the rest of this film",
                " and so is the film",
                ", like the rest",
            )
        )
        if whole_film
        else ""
    )
    return _fit(f"{shows(region).capitalize()} no abnormality; {rng.choice(NORMAL)}", closing)


def described(shown: Shown | None) -> str:
    """The finding as a report names it: "a 1.2 cm calcified granuloma", "mild consolidation", "surgical clips",
    "an endotracheal tube"."""
    if shown is None:
        return "no abnormality"
    if FINDING_BY_NAME[shown.finding].kind == "nodule":
        return f"a {shown.size_cm} cm {shown.finding}"
    if graded(shown.finding):
        return f"{shown.severity} {shown.finding}"
    if plural(shown.finding):
        return shown.finding
    return f"{'an' if shown.finding[0] in 'aeiou' else 'a'} {shown.finding}"


def _options(rng: random.Random, correct: str, pool: list[str]) -> tuple[list[str], str]:
    """Options with the correct one at a random place; 4 in SINGLE_FOUR_OPTIONS of questions, else 3."""
    n = 4 if rng.random() < SINGLE_FOUR_OPTIONS else 3
    options = [correct] + rng.sample(sorted(set(pool) - {correct}), k=min(n - 1, len(set(pool) - {correct})))
    rng.shuffle(options)
    return options, chr(65 + options.index(correct))


ABNORMALITY_QUESTIONS = (
    "what abnormality is seen in the {r}",
    "what is observed in the {r}",
    "what {does} the {r} show",
    "which finding is present in the {r}",
    "what can be seen in the {r}",
    "what finding involves the {r}",
    "describe any abnormality of the {r}",
)
# The open questions on a finding `{f}` the film shows in `{r}`, by content type.
OPEN_QUESTIONS = {
    "location": ("where {be} the {f} located", "in which region {be} the {f} seen", "where in the chest {be} the {f}"),
    "severity": (
        "how severe {be} the {f} in the {r}",
        "what is the severity of the {f} in the {r}",
        "how would you grade the {f} in the {r}",
    ),
    "disease": (
        "what condition could the {f} in the {r} indicate",
        "what disease might the {f} in the {r} point to",
        "what underlying condition fits the {f} in the {r}",
    ),
    "size": (
        "what is the size of the {f} in the {r}",
        "how large is the {f} in the {r}",
        "what does the {f} in the {r} measure",
    ),
    "implication": (
        "what {does} the {f} in the {r} suggest",
        "what is the significance of the {f} in the {r}",
        "what {does} the {f} in the {r} imply",
    ),
}


def _open_question_about(rng: random.Random, shown: Shown, ctype: str) -> tuple[str, str]:
    """The open question of type `ctype` on a finding the film shows, and its answer. Every type draws
    its phrasing, so that the one asked leaves the draws after it unchanged."""
    f, words = FINDING_BY_NAME[shown.finding], {"f": shown.finding, "r": shown.region}
    asked = {t: rng.choice(q).format(be=be(f.name), does=does(f.name), **words) for t, q in OPEN_QUESTIONS.items()}
    answers = {
        "location": f"In the {shown.region}.",
        "severity": f"{shown.severity.capitalize()}.",
        "disease": f"{f.disease.capitalize()}.",
        "size": f"About {shown.size_cm} cm.",
        "implication": f"{f.implication.capitalize()}.",
    }
    return asked[ctype], answers[ctype]


def _single_choice_about(rng: random.Random, shown: Shown, ctype: str) -> tuple[str, list[str], str, str]:
    """The type asked (location falls back where a finding has too few places), options, answer letter
    and question of a single-choice question on a finding the film shows."""
    region, f = shown.region, FINDING_BY_NAME[shown.finding]
    if ctype == "location" and len(f.regions) < 3:  # too few places to choose from
        ctype = "severity" if graded(f.name) else "implication"
    if ctype == "location":
        options, answer = _options(rng, region, list(f.regions))
        core = rng.choice(
            (f"where {be(f.name)} the {f.name} located", f"which region {does(f.name)} the {f.name} involve")
        )
    elif ctype == "severity":
        options, answer = _options(rng, shown.severity, [*SEVERITIES, "none"])
        core = rng.choice(
            (
                f"how severe {be(f.name)} the {f.name} in the {region}",
                f"what grade {be(f.name)} the {f.name} in the {region}",
            )
        )
    elif ctype == "size":
        options, answer = _options(rng, f"{shown.size_cm} cm", [f"{s} cm" for s in SIZES_CM])
        core = rng.choice(
            (f"what is the size of the {f.name} in the {region}", f"how large is the {f.name} in the {region}")
        )
    else:
        attribute = "disease" if ctype == "disease" else "implication"
        pool = [getattr(FINDING_BY_NAME[n], attribute) for n in findings_at(region)]
        pool += [getattr(g, attribute) for g in FINDINGS if g.name not in findings_at(region)]
        options, answer = _options(rng, getattr(f, attribute), pool[: max(4, len(findings_at(region)))])
        core = rng.choice(
            (
                f"which condition best explains the finding in the {region}",
                f"what diagnosis does the finding in the {region} favour",
            )
            if ctype == "disease"
            else (
                f"what does the finding in the {region} most likely indicate",
                f"what is the finding in the {region} most likely a sign of",
            )
        )
    return ctype, options, answer, core


STATEMENT_QUESTIONS = (
    "which findings are present",
    "which statements are correct",
    "which of these are true",
    "which descriptions are correct",
    "what abnormalities are present",
    "which of the following are shown",
    "which options match the appearance",
    "which of these findings can be confirmed",
)
DISEASE_STATEMENT_QUESTIONS = (
    "which findings support a diagnosis",
    "which findings point to an underlying disease",
    "which findings would explain the symptoms",
)


def _statements_reason(rng: random.Random, true: list[str], letters: list[str]) -> str:
    """Why the `true` statements (letters `letters`) hold: what the film shows and what it lacks."""
    shown = [o for o in true if not o.startswith("no ")]
    missing = [o.removeprefix("no ") for o in true if o.startswith("no ")]
    text = (
        rng.choice(("The film shows ", "The image shows ", "This CXR shows ", "Seen here: ")) + _and(shown)
        if shown
        else "There is " + " and ".join(f"no {o}" for o in missing)
    )
    extra = f"; there is no {_and(missing)}" if shown and missing else ""
    if len(text) > 149:
        text = f"Options {_and(letters)} match the film, which shows {shown[0] if shown else 'no ' + missing[0]}"
    return _fit(text, extra)


class QuestionWriter:
    """Writes one image's questions, deciding its findings as they are asked."""

    def __init__(self, rng: random.Random, findings: Findings):
        self.rng = rng
        self.findings = findings

    def _present(self, share: float) -> bool:
        return not self.findings.healthy and self.rng.random() < share

    def _target(self, ctype: str) -> Shown | None:
        """A finding the question is about, present on an image that has findings (one with a size for `size`)."""
        fitting = [
            s
            for s in self.findings.shown
            if (ctype != "severity" or graded(s.finding)) and (ctype != "size" or s.finding in SIZED)
        ]
        if fitting and self.rng.random() < ASK_AGAIN_SHARE:
            return self.rng.choice(fitting)
        for _ in range(20):  # a finding said absent nearby cannot show: ask about another
            finding, region = pick_pair(self.rng, graded_only=ctype == "severity")
            if ctype == "size":
                finding = self.rng.choice(SIZED)
            shown = self.findings.decide(finding, region, True, self.rng)
            if shown is not None or self.findings.healthy:
                return shown
        return self.rng.choice(fitting) if fitting else shown

    def _clear_reason(self, region: str) -> str:
        return healthy_reason(self.rng, region, whole_film=self.findings.healthy)

    def open_ended(self) -> dict:
        rng, ctype = self.rng, content_type(self.rng, "open_ended")
        shown = self._target(ctype)
        if shown is None or ctype == "abnormality":
            region = shown.region if shown else pick_region(rng)
            question = _phrase(rng, rng.choice(ABNORMALITY_QUESTIONS).format(r=region, does=does(region)))
            answer = described(shown).capitalize() + "."
            ctype = "abnormality"
        else:
            region = shown.region
            question, answer = _open_question_about(rng, shown, ctype)
            question = _phrase(rng, question)
        reason = present_reason(rng, shown, region) if shown else self._clear_reason(region)
        return {
            "question": question,
            "type": ctype,
            "answer": answer,
            "reason": reason,
            "regions": _boxes(rng, [region]),
        }

    def closed_ended(self) -> dict:
        rng, ctype = self.rng, content_type(self.rng, "closed_ended")
        finding, region = pick_pair(rng, graded_only=ctype == "severity")
        wanted = self._present(CLOSED_ASK_PRESENT / (1 - HEALTHY_SHARE))
        if ctype == "severity":
            severity = rng.choice(SEVERITIES)
            shown = self.findings.decide(
                finding,
                region,
                wanted,
                rng,
                severity=severity if wanted else rng.choice([s for s in SEVERITIES if s != severity]),
            )
            yes = shown is not None and shown.severity == severity
            core = rng.choice(
                (
                    f"{be(finding)} there {severity} {finding} in the {region}",
                    f"{does(region)} the {region} show {severity} {finding}",
                    f"{be(finding)} the {finding} in the {region} {severity}",
                )
            )
        else:
            shown = self.findings.decide(finding, region, wanted, rng)
            yes = shown is not None
            core = rng.choice(
                (
                    f"{be(finding)} there {{d}}{{f}} in the {{r}}",
                    f"{does(region)} the {{r}} show {{d}}{{f}}",
                    f"{be(finding)} {{d}}{{f}} seen in the {{r}}",
                    "can {d}{f} be identified in the {r}",
                    "is there evidence of {d}{f} in the {r}",
                    f"{be(finding)} {{d}}{{f}} present in the {{r}}",
                )
            ).format(d=rng.choice(DESCRIPTORS), f=finding, r=region)
        if shown is not None:  # yes, or a severity question answered no by the grade the film shows
            reason = present_reason(rng, shown, region)
        else:
            reason = absent_reason(rng, finding, region, severity if ctype == "severity" else None)
        return {
            "question": _phrase(rng, core),
            "type": ctype,
            "answer": "Yes." if yes else "No.",
            "reason": reason,
            "regions": _boxes(rng, [region]),
        }

    def single_choice(self) -> dict:
        rng, ctype = self.rng, content_type(self.rng, "single_choice")
        shown = self._target(ctype)
        if shown is None or ctype == "abnormality":
            region = shown.region if shown else pick_region(rng)
            shown, options, answer, core = self._single_abnormality(region)
            ctype = "abnormality"
        else:
            region = shown.region
            ctype, options, answer, core = _single_choice_about(rng, shown, ctype)
        reason = present_reason(rng, shown, region) if shown else self._clear_reason(region)
        return {
            "question": _phrase(rng, core),
            "choices": _letters(options),
            "type": ctype,
            "answer": answer,
            "reason": reason,
            "regions": _boxes(rng, [region]),
        }

    def _single_abnormality(self, region: str) -> tuple[Shown | None, list[str], str, str]:
        """What `region` shows among findings seen there and "normal", none of the options being
        another finding the film shows there."""
        rng = self.rng
        present = [s.finding for s in self.findings.at(region)]
        correct = present[0] if present else "normal"
        shown = self.findings.at(region)[0] if present else None
        others = set(present[1:])
        options, answer = _options(rng, correct, [f for f in [*findings_at(region), "normal"] if f not in others])
        core = rng.choice(
            (
                "what is observed in the {r}",
                f"what abnormality {does(region)} the {{r}} show",
                "which finding is seen in the {r}",
                "which of these best describes the {r}",
                "what is the main finding in the {r}",
            )
        ).format(r=region)
        return shown, options, answer, core

    def multi_choice(self) -> dict:
        """2-4 correct options; tried again in the rare case earlier questions left none true."""
        for _ in range(20):
            question = self._multi_choice()
            if len(question["answer"]) >= min(MULTI_CORRECT):
                return question
        return question

    def _multi_choice(self) -> dict:
        rng, ctype = self.rng, content_type(self.rng, "multi_choice")
        if self.findings.healthy and ctype == "location":
            ctype = "abnormality"
        k = int(_pick(rng, {str(n): p for n, p in MULTI_CORRECT.items()}))
        correct = set(rng.sample(range(4), k=k))
        if ctype == "location":
            finding, options, truths, core, grounded = self._multi_location(correct)
        else:
            finding, options, truths, core, grounded = self._multi_statements(ctype, correct)
        letters = [chr(65 + i) for i, t in enumerate(truths) if t]
        grounded = list(dict.fromkeys(grounded)) or [options[0] if ctype == "location" else pick_region(rng)]
        true = [o for o, t in zip(options, truths) if t]
        if not true:  # asked again by `multi_choice`
            reason = "None of the options matches what this film shows, on a careful look at each region named."
        elif ctype == "location":
            text = f"{finding.capitalize()} {be(finding)} seen in the {_and(true)}"
            reason = _fit(
                text, f", not in the {_and([o for o, t in zip(options, truths) if not t])}" if len(true) < 4 else ""
            )
        else:
            reason = _statements_reason(rng, true, letters)
        return {
            "question": _phrase(rng, core),
            "choices": _letters(options),
            "type": ctype,
            "answer": letters,
            "reason": reason,
            "regions": grounded[:4],
        }

    def _multi_location(self, correct: set[int]) -> tuple[str, list[str], list[bool], str, list[str]]:
        """Four regions of one finding, those at the `correct` positions showing it."""
        rng = self.rng
        finding = rng.choice([f for f in FINDINGS if len(f.regions) >= 4])
        regions = rng.sample(finding.regions, k=4)
        truths = [self.findings.decide(finding.name, r, i in correct, rng) is not None for i, r in enumerate(regions)]
        core = rng.choice(
            (
                "which regions show {d}{f}",
                "where {is_} {d}{f} seen",
                "which areas contain {d}{f}",
                "in which regions {is_} there {d}{f}",
            )
        ).format(d=rng.choice(DESCRIPTORS), f=finding.name, is_=be(finding.name))
        grounded = [r for r, t in zip(regions, truths) if t] or regions[:1]
        return finding.name, regions, truths, core, grounded

    def _multi_statements(self, ctype: str, correct: set[int]) -> tuple[str, list[str], list[bool], str, list[str]]:
        """Four statements on distinct findings, some negated ("no X in the R"), true at the
        `correct` positions; the finding returned is the last one stated."""
        rng = self.rng
        pairs: list[tuple[str, str]] = []
        while len(pairs) < 4:
            pair = pick_pair(rng)
            if pair[0] not in (p[0] for p in pairs):
                pairs.append(pair)
        options, truths, grounded = [], [], []
        for i, (finding, region) in enumerate(pairs):
            negated = (i in correct) if self.findings.healthy else rng.random() < NEGATION_OPTION_SHARE
            want = (i in correct) != negated
            shown = self.findings.decide(finding, region, want, rng)
            truths.append((shown is not None) != negated)
            options.append(f"no {finding} in the {region}" if negated else f"{finding} in the {region}")
            if truths[-1] and not negated:  # an absence is not boxed (public samples: one box for three)
                grounded.append(region)
        core = rng.choice(STATEMENT_QUESTIONS)
        if ctype == "disease":
            core = rng.choice(DISEASE_STATEMENT_QUESTIONS)
        named = list(dict.fromkeys(region for _, region in pairs))
        if rng.random() < 0.7:  # the regions every option is about, true or not
            core += " in the " + _and(named[:3]) + (" and elsewhere" if len(named) > 3 else "")
        return finding, options, truths, core, grounded


def healthy(rng: random.Random) -> bool:
    return rng.random() < HEALTHY_SHARE

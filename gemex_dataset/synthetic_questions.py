"""An image's synthetic questions, and the findings they make the image show.

Each question is worded first, from the release's distributions alone; its answer is then drawn
from the answer prior (or read from what the image already shows), and the findings it needs are
added to the image's `Findings`. The image is drawn from those findings, so the answer lives in the
pixels and not in the wording: the correct option's place, length and text are independent of it.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from gemex_dataset.synthetic_distributions import (
    AGED_SHARE,
    AGES,
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


@dataclass
class Findings:
    """What an image shows: each (finding, region) decided once, present (`Shown`) or absent (None)."""

    healthy: bool
    decided: dict[tuple[str, str], Shown | None] = field(default_factory=dict)

    @property
    def shown(self) -> list[Shown]:
        return [s for s in self.decided.values() if s is not None]

    def decide(self, finding: str, region: str, present: bool, rng: random.Random,
               severity: str | None = None, size_cm: float | None = None) -> Shown | None:
        """Whether `finding` shows in `region`: as decided before, else as asked (never on a healthy image)."""
        key = (finding, region)
        if key not in self.decided:
            self.decided[key] = Shown(finding, region, severity or rng.choice(SEVERITIES),
                                      size_cm or rng.choice(SIZES_CM)) if present and not self.healthy else None
        return self.decided[key]

    def at(self, region: str) -> list[Shown]:
        return [s for s in self.shown if s.region == region]


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


def _phrase(rng: random.Random, core: str) -> str:
    aged = f" (patient aged {rng.randint(*AGES)})" if rng.random() < AGED_SHARE else ""
    text = rng.choice(LEADS) + core + rng.choice(TAILS) + rng.choice(CONTEXTS) + aged + "?"
    return text[0].upper() + text[1:]


def _boxes(rng: random.Random, regions: list[str]) -> list[str]:
    if len(regions) == 1 and rng.random() < SECOND_BOX_SHARE:
        regions = regions + [rng.choice([r for r in REGION_SHARES if r != regions[0]])]
    return regions


def _letters(options: list[str]) -> list[str]:
    return [f"{chr(65 + i)}: {o[0].upper()}{o[1:]}" for i, o in enumerate(options)]


def _reason(rng: random.Random, region: str, what: str) -> str:
    """A reason of 60-150 characters (GEMeX: "mostly between 60 and 150"; public samples: median 83-98)."""
    look = rng.choice(("the appearance of", "the density in", "the contour of", "the pattern in", "the edges of"))
    because = rng.choice(("", "", "", " on this film"))
    text = f"{what[0].upper()}{what[1:]}, judged from {look} this region{because}."
    return text if len(text) >= 60 else text[:-1] + ", as the image shows."


def described(shown: Shown | None) -> str:
    if shown is None:
        return "no abnormality"
    if FINDING_BY_NAME[shown.finding].kind == "nodule":
        return f"a {shown.size_cm} cm {shown.finding}"
    return f"{shown.severity} {shown.finding}" if graded(shown.finding) else f"a {shown.finding}"


def _options(rng: random.Random, correct: str, pool: list[str]) -> tuple[list[str], str]:
    """Options with the correct one at a random place; 4 in SINGLE_FOUR_OPTIONS of questions, else 3."""
    n = 4 if rng.random() < SINGLE_FOUR_OPTIONS else 3
    options = [correct] + rng.sample(sorted(set(pool) - {correct}), k=min(n - 1, len(set(pool) - {correct})))
    rng.shuffle(options)
    return options, chr(65 + options.index(correct))


class QuestionWriter:
    """Writes one image's questions, deciding its findings as they are asked."""

    def __init__(self, rng: random.Random, findings: Findings):
        self.rng = rng
        self.findings = findings

    def _present(self, share: float) -> bool:
        return not self.findings.healthy and self.rng.random() < share

    def _target(self, ctype: str) -> Shown | None:
        """A finding the question is about, present on an image that has findings (one with a size for `size`)."""
        fitting = [s for s in self.findings.shown if (ctype != "severity" or graded(s.finding)) and (ctype != "size" or s.finding in SIZED)]
        if fitting and self.rng.random() < ASK_AGAIN_SHARE:
            return self.rng.choice(fitting)
        finding, region = pick_pair(self.rng, graded_only=ctype == "severity")
        if ctype == "size":
            finding = self.rng.choice(SIZED)
        return self.findings.decide(finding, region, True, self.rng)

    def open_ended(self) -> dict:
        rng, ctype = self.rng, content_type(self.rng, "open_ended")
        shown = self._target(ctype)
        if shown is None or ctype == "abnormality":
            region = shown.region if shown else pick_region(rng)
            question = _phrase(rng, rng.choice(("what abnormality is seen in the {r}", "what is observed in the {r}",
                                                "what does the {r} show", "which finding is present in the {r}")).format(r=region))
            answer = described(shown).capitalize() + "."
            ctype = "abnormality"
        else:
            region, f = shown.region, FINDING_BY_NAME[shown.finding]
            question, answer = {
                "location": (f"where is the {f.name} located", f"In the {region}."),
                "severity": (f"how severe is the {f.name} in the {region}", f"{shown.severity.capitalize()}."),
                "disease": (f"what condition could the {f.name} in the {region} indicate", f"{f.disease.capitalize()}."),
                "size": (f"what is the size of the {f.name} in the {region}", f"About {shown.size_cm} cm."),
                "implication": (f"what does the {f.name} in the {region} suggest", f"{f.implication.capitalize()}."),
            }[ctype]
            question = _phrase(rng, question)
        return {"question": question, "type": ctype, "answer": answer,
                "reason": _reason(rng, region, f"the {region} shows {described(shown)}"), "regions": _boxes(rng, [region])}

    def closed_ended(self) -> dict:
        rng, ctype = self.rng, content_type(self.rng, "closed_ended")
        finding, region = pick_pair(rng, graded_only=ctype == "severity")
        wanted = self._present(CLOSED_ASK_PRESENT / (1 - HEALTHY_SHARE))
        if ctype == "severity":
            severity = rng.choice(SEVERITIES)
            shown = self.findings.decide(finding, region, wanted, rng,
                                         severity=severity if wanted else rng.choice([s for s in SEVERITIES if s != severity]))
            yes = shown is not None and shown.severity == severity
            core = f"is there {severity} {finding} in the {region}"
        else:
            shown = self.findings.decide(finding, region, wanted, rng)
            yes = shown is not None
            core = rng.choice(("is there {d}{f} in the {r}", "does the {r} show {d}{f}", "is {d}{f} seen in the {r}",
                               "can {d}{f} be identified in the {r}")).format(d=rng.choice(DESCRIPTORS), f=finding, r=region)
        what = f"the {region} {'shows' if yes else 'does not show'} {severity + ' ' if ctype == 'severity' else ''}{finding}"
        return {"question": _phrase(rng, core), "type": ctype, "answer": "Yes." if yes else "No.",
                "reason": _reason(rng, region, what), "regions": _boxes(rng, [region])}

    def single_choice(self) -> dict:
        rng, ctype = self.rng, content_type(self.rng, "single_choice")
        shown = self._target(ctype)
        if shown is None or ctype == "abnormality":
            region = shown.region if shown else pick_region(rng)
            present = [s.finding for s in self.findings.at(region)]
            correct = present[0] if present else "normal"
            shown = self.findings.at(region)[0] if present else None
            others = set(present[1:])
            options, answer = _options(rng, correct, [f for f in [*findings_at(region), "normal"] if f not in others])
            core = rng.choice(("what is observed in the {r}", "what abnormality does the {r} show",
                               "which finding is seen in the {r}")).format(r=region)
            ctype = "abnormality"
        else:
            region, f = shown.region, FINDING_BY_NAME[shown.finding]
            if ctype == "location" and len(f.regions) < 3:  # too few places to choose from
                ctype = "severity" if graded(f.name) else "implication"
            if ctype == "location":
                options, answer = _options(rng, region, list(f.regions))
                core = f"where is the {f.name} located"
            elif ctype == "severity":
                options, answer = _options(rng, shown.severity, [*SEVERITIES, "none"])
                core = f"how severe is the {f.name} in the {region}"
            elif ctype == "size":
                options, answer = _options(rng, f"{shown.size_cm} cm", [f"{s} cm" for s in SIZES_CM])
                core = f"what is the size of the {f.name} in the {region}"
            else:
                attribute = "disease" if ctype == "disease" else "implication"
                pool = [getattr(FINDING_BY_NAME[n], attribute) for n in findings_at(region)]
                pool += [getattr(g, attribute) for g in FINDINGS if g.name not in findings_at(region)]
                options, answer = _options(rng, getattr(f, attribute), pool[:max(4, len(findings_at(region)))])
                core = (f"which condition best explains the finding in the {region}" if ctype == "disease"
                        else f"what does the finding in the {region} most likely indicate")
        return {"question": _phrase(rng, core), "choices": _letters(options), "type": ctype, "answer": answer,
                "reason": _reason(rng, region, f"the {region} shows {described(shown)}"), "regions": _boxes(rng, [region])}

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
            finding = rng.choice([f for f in FINDINGS if len(f.regions) >= 4])
            regions = rng.sample(finding.regions, k=4)
            truths = [self.findings.decide(finding.name, r, i in correct, rng) is not None for i, r in enumerate(regions)]
            options = regions
            core = f"which regions show {rng.choice(DESCRIPTORS)}{finding.name}"
            grounded = [r for r, t in zip(regions, truths) if t] or regions[:1]
        else:
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
            core = rng.choice(("which findings are present", "which statements describe this image",
                               "which of these are true of this radiograph", "select every correct description"))
            if ctype == "disease":
                core = "which findings support a diagnosis"
        letters = [chr(65 + i) for i, t in enumerate(truths) if t]
        grounded = list(dict.fromkeys(grounded)) or [options[0] if ctype == "location" else pick_region(rng)]
        what = "the image bears out " + " and ".join(o.split(" in the ")[0].lower() for o, t in zip(options, truths) if t)
        if len(what) > 90:
            what = f"the image bears out options {', '.join(letters)}"
        return {"question": _phrase(rng, core), "choices": _letters(options), "type": ctype, "answer": letters,
                "reason": _reason(rng, grounded[0], what), "regions": grounded[:4]}


def healthy(rng: random.Random) -> bool:
    return rng.random() < HEALTHY_SHARE


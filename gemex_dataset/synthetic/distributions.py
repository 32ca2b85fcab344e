"""Every distribution the synthetic GEMeX release draws from, each with where its number comes from.

Sources: "GEMeX Table 3" / "GEMeX Fig. 6" (the paper), "public samples" (measured on
../shared/samples/gemex-public by benchmarks/fidelity_gemex.py), or "chosen: plausible" where neither
gives a number. The findings are drawing recipes, not medicine: each names what is painted into the
image (`kind`) and the regions it may sit in.
"""

from __future__ import annotations

from dataclasses import dataclass

# GEMeX Table 3: images per split and questions in all.
PAPER_IMAGES = {"train": 149_535, "valid": 1_190, "test": 300}
PAPER_QUESTIONS = 1_605_575

# Questions an image, per type. Train/valid: 11 an image before the ~3% the paper's cleaning removed
# (GEMeX Table 3: ~10.5 an image). Test: GEMeX Table 3, 13.2 an image and up to 5 of a type (public
# samples: 3-5 open, 1-2 closed, 3-5 single, 4-5 multi), drawn per image from these choices.
QUESTIONS_PER_IMAGE = {"open_ended": 3, "closed_ended": 2, "single_choice": 3, "multi_choice": 3}
TEST_QUESTIONS_PER_IMAGE = {
    "open_ended": (3, 4),
    "closed_ended": (1, 1, 2),
    "single_choice": (3, 4, 5),
    "multi_choice": (4, 5, 5, 4, 5),
}
KEEP_RATE = PAPER_QUESTIONS / (sum(PAPER_IMAGES.values()) * sum(QUESTIONS_PER_IMAGE.values()))

HEALTHY_SHARE = 0.125  # GEMeX Fig. 6: ~12.5% of images have no finding
CLOSED_YES_SHARE = 0.29  # public samples: "Yes." in ~29% of closed-ended answers
# A closed-ended question asks for its finding present this often; earlier questions have already made
# some findings present, so the release's "Yes." share lands at CLOSED_YES_SHARE (tuned, fidelity_gemex).
CLOSED_ASK_PRESENT = 0.24
MULTI_CORRECT = {2: 0.6, 3: 0.3, 4: 0.1}  # public samples: 2-4 correct options, mean ~2.5
SINGLE_FOUR_OPTIONS = 0.96  # public samples: 4 options in ~96% of single-choice questions (else 3)
NEGATION_OPTION_SHARE = 0.15  # chosen: plausible ("No pleural effusions" in the public samples)
# A question about a finding asks about one the image already shows this often (chosen: plausible; keeps
# an image at a few findings, as a report has, instead of one per question).
ASK_AGAIN_SHARE = 0.75
SECOND_BOX_SHARE = 0.04  # GEMeX Table 3: 1.02-1.06 boxes a question for open, closed and single

# Content types: GEMeX Table 3 gives abnormality 57.7%; the rest chosen: plausible, over the types the
# paper and the public samples use (no `finding`, which the generator once invented). These are draw
# weights: abnormality is also the fallback of questions on healthy images, so its weight is lower than
# the 57.7% the release lands at (tuned, fidelity_gemex).
CONTENT_TYPE_SHARES = {
    "abnormality": 0.36,
    "location": 0.12,
    "severity": 0.11,
    "disease": 0.11,
    "size": 0.043,
    "implication": 0.05,
}
CONTENT_TYPES_BY_QUESTION = {
    "open_ended": ("abnormality", "location", "severity", "disease", "size", "implication"),
    "closed_ended": ("abnormality", "severity", "disease"),
    "single_choice": ("abnormality", "location", "severity", "disease", "size", "implication"),
    "multi_choice": ("abnormality", "location", "disease"),
}

# Region draw weights. Public samples: bilateral lung ~36% of grounded regions, cardiac
# region ~16%; the rest spread (chosen: plausible). Bilateral lung weighs more than 36% because multi-choice
# location questions ground in regions drawn otherwise (tuned, fidelity_gemex).
REGION_SHARES = {
    "bilateral lung": 0.42,
    "cardiac region": 0.16,
    "right lung": 0.04,
    "left lung": 0.04,
    "right lower lung zone": 0.035,
    "left lower lung zone": 0.035,
    "bilateral lower lung zone": 0.03,
    "right upper lung zone": 0.02,
    "left upper lung zone": 0.02,
    "right mid lung zone": 0.015,
    "left mid lung zone": 0.015,
    "bilateral hilar structures": 0.03,
    "right hilar structures": 0.01,
    "left hilar structures": 0.01,
    "right hemidiaphragm": 0.02,
    "left hemidiaphragm": 0.015,
    "trachea": 0.025,
    "svc": 0.02,
    "mediastinum": 0.025,
    "spine": 0.015,
    "abdomen": 0.02,
    "right mid-to-lower lung zone": 0.01,
    "left mid-to-lower lung zone": 0.01,
    "bilateral upper lung zone": 0.01,
    "bilateral mid lung zone": 0.01,
}

SEVERITIES = ("mild", "moderate", "severe")  # chosen: plausible; drawn as the share of the box filled
SEVERITY_EXTENT = {"mild": 0.35, "moderate": 0.6, "severe": 0.9}
SIZES_CM = (0.5, 0.8, 1.2, 1.5, 2.0, 2.5, 3.0, 3.5, 4.0)  # public samples: "1.2 cm"; chosen: plausible
CHEST_WIDTH_CM = 34.0  # chosen: plausible; turns a size into pixels

LUNG = (
    "bilateral lung",
    "right lung",
    "left lung",
    "right lower lung zone",
    "left lower lung zone",
    "bilateral lower lung zone",
    "right upper lung zone",
    "left upper lung zone",
    "right mid lung zone",
    "left mid lung zone",
    "right mid-to-lower lung zone",
    "left mid-to-lower lung zone",
    "bilateral upper lung zone",
    "bilateral mid lung zone",
)
ANYWHERE = tuple(REGION_SHARES)


@dataclass(frozen=True)
class FindingKind:
    """A finding the generator can draw: how (`kind`), where, what it suggests, and a disease it points to."""

    name: str
    kind: str  # opacity, nodule, effusion, pneumothorax, line, heart, hilum, dome, spots, widening, clips
    regions: tuple[str, ...]
    implication: str
    disease: str


FINDINGS: tuple[FindingKind, ...] = (
    FindingKind("consolidation", "opacity", LUNG, "an infectious process", "pneumonia"),
    FindingKind("atelectasis", "opacity", LUNG, "volume loss", "airway obstruction"),
    FindingKind(
        "pulmonary edema",
        "opacity",
        ("bilateral lung", "bilateral lower lung zone", "bilateral mid lung zone"),
        "fluid overload",
        "heart failure",
    ),
    FindingKind(
        "pleural effusion",
        "effusion",
        (
            "bilateral lung",
            "right lower lung zone",
            "left lower lung zone",
            "bilateral lower lung zone",
            "right lung",
            "left lung",
        ),
        "fluid in the pleural space",
        "congestive heart failure",
    ),
    FindingKind(
        "pneumothorax",
        "pneumothorax",
        ("right upper lung zone", "left upper lung zone", "right lung", "left lung", "bilateral upper lung zone"),
        "air in the pleural space",
        "lung collapse",
    ),
    FindingKind("nodular opacity", "nodule", ANYWHERE, "a focal lesion needing follow-up", "neoplasm"),
    FindingKind("calcified granuloma", "nodule", ANYWHERE, "a prior granulomatous infection", "healed tuberculosis"),
    FindingKind("surgical clips", "clips", ANYWHERE, "prior surgery", "post-surgical change"),
    FindingKind("cardiomegaly", "heart", ("cardiac region",), "cardiac enlargement", "cardiomyopathy"),
    FindingKind("pacemaker leads", "line", ("cardiac region",), "a cardiac rhythm device", "conduction disease"),
    FindingKind("endotracheal tube", "line", ("trachea",), "mechanical ventilation", "respiratory failure"),
    FindingKind("central venous catheter", "line", ("svc",), "central venous access", "need for long-term therapy"),
    FindingKind("nasogastric tube", "line", ("abdomen",), "enteric access", "feeding difficulty"),
    FindingKind(
        "hilar enlargement",
        "hilum",
        ("bilateral hilar structures", "right hilar structures", "left hilar structures"),
        "lymphadenopathy or vascular congestion",
        "pulmonary hypertension",
    ),
    FindingKind(
        "elevated hemidiaphragm",
        "dome",
        ("right hemidiaphragm", "left hemidiaphragm"),
        "reduced lung volume on that side",
        "phrenic nerve palsy",
    ),
    FindingKind("degenerative changes", "spots", ("spine",), "age-related spine changes", "spondylosis"),
    FindingKind(
        "widened mediastinum", "widening", ("mediastinum",), "a mediastinal mass or vascular cause", "aortic dilatation"
    ),
)
FINDING_BY_NAME = {f.name: f for f in FINDINGS}
SIZED = ("nodular opacity", "calcified granuloma")  # the findings a size question asks about
UNGRADED_KINDS = ("line", "clips", "nodule")  # devices and nodules have no severity (a nodule has a size)

# Question wording: an opening that names the image or a closing that does (never both), a clinical
# setting, and several wordings of each question vary the text (GEMeX questions are ~98% distinct, public
# samples, with no patient details appended); none of them depends on the answer.
LEADS = (
    "On this chest X-ray, ",
    "In this radiograph, ",
    "Looking at the image, ",
    "Based on the CXR, ",
    "On this frontal view, ",
    "In this study, ",
    "On the current film, ",
    "From this image, ",
    "On this exam, ",
    "Reviewing this CXR, ",
    "On this PA film, ",
    "On this portable film, ",
)
TAILS = (
    " on this image",
    " in this CXR",
    " on the frontal view",
    " on this study",
    " in this radiograph",
    " on today's film",
    " on this exam",
    " on this chest film",
    " in this chest X-ray",
    " on the PA projection",
)
CONTEXTS = (
    "",
    " in a patient with cough",
    " in a patient with dyspnea",
    " after line placement",
    " on follow-up",
    " in the ICU setting",
    " after surgery",
    " in a patient with fever",
    " in a patient with chest pain",
    " on admission",
    " before discharge",
    " in a patient with hypoxia",
    " after trauma",
    " in a smoker",
    " after intubation",
    " in a patient with sepsis",
    " after a fall",
    " in a patient with hemoptysis",
    " before surgery",
    " in a patient with weight loss",
    " after chest tube removal",
    " in a patient with tachycardia",
    " after a CABG",
    " in a patient with heart failure",
    " in a patient with COPD",
    " in a patient with wheezing",
    " after central line placement",
    " in a patient with syncope",
    " in a patient with leg swelling",
    " in an immunocompromised patient",
    " after chemotherapy",
    " in a patient with a history of cancer",
    " in a patient with renal failure",
    " before elective surgery",
    " in a patient with abdominal pain",
    " after pacemaker insertion",
    " in a patient with a prior TB exposure",
    " after a motor vehicle collision",
)
DESCRIPTORS = ("", "any ", "focal ", "visible ", "definite ", "residual ", "new ")
PLURAL_FINDINGS = ("surgical clips", "pacemaker leads", "degenerative changes")
"""Finding names that take a plural verb and no article ("surgical clips are seen")."""

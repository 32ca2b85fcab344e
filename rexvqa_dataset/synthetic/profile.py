"""What the synthetic ReXVQA release is made to look like: every distribution, with its source.

Sources: "paper" is ReXVQA (arXiv 2506.04353); "formats.md" is ../shared/docs/formats.md;
"samples" is what ../shared/samples/rexvqa shows; "chosen: plausible" marks a value neither
gives, picked to look like chest radiography and written down here so it can be argued with.
`benchmarks/fidelity_rexvqa.py` measures a release against these.
"""

from __future__ import annotations

from dataclasses import dataclass

from rexvqa_dataset.features import TASKS

PUBLIC_STUDIES = 160_000
"""paper: studies of ReXGradient-160K behind the public questions."""
PUBLIC_QUESTIONS = 653_834
"""paper: public questions (train + valid + test)."""
PUBLIC_TEST_QUESTIONS = 40_826
"""paper: questions of the public test split."""
QUESTIONS_PER_STUDY = PUBLIC_QUESTIONS / PUBLIC_STUDIES

TASK_SHARES = dict(zip(TASKS, (0.361, 0.061, 0.365, 0.209, 0.004)))
"""paper: share of each task among the questions (presence, location, negation, differential, geometric)."""

SPLIT_SHARES = {
    "train": 1 - 2 * PUBLIC_TEST_QUESTIONS / PUBLIC_QUESTIONS,
    "valid": PUBLIC_TEST_QUESTIONS / PUBLIC_QUESTIONS,
    "test": PUBLIC_TEST_QUESTIONS / PUBLIC_QUESTIONS,
}
"""Share of studies (so of questions) per split. test: paper (40,826 of 653,834, 6.2%); valid: chosen:
plausible, the test's size (formats.md: per-split counts not known)."""

IMAGES_PER_STUDY = {1: 0.45, 2: 0.42, 3: 0.09, 4: 0.04}
"""formats.md: about 1.7 images a study (this gives 1.72); the spread over 1-4 is chosen: plausible."""

FRONTAL_VIEWS = {"PA": 0.55, "AP": 0.45}
"""chosen: plausible. The first image of a study is frontal; PA or AP."""
LATERAL_VIEWS = {"LATERAL": 0.93, "LL": 0.04, "UNKNOWN": 0.03}
"""chosen: plausible. A study's second image is lateral, mostly `LATERAL`."""
NULL_VIEW_RATE = 0.01
"""chosen: plausible. formats.md lists null among the values; real studies are mostly PA/AP/LATERAL."""
SHORT_VIEW_LIST_RATE = 0.02
"""chosen: plausible. formats.md: view lists may be shorter than the image list."""

ID_ALPHABET = "ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"
ID_PATTERN = r"^GRDN[A-Z0-9]{12}$"
"""samples: `PatientID` and `AccessionNumber` are GRDN + 12 of [A-Z0-9] (rexgradient_real_image_paths.txt)."""
UID_ROOT = "1.2.826.0.1.3680043.8.498"
UID_SUFFIX_DIGITS = 38
"""samples: study, series and instance UIDs are the root above and a 38-digit number."""

RELEASE_SIDES = (600, 800)
"""formats.md: the release's PNGs are 600-800 px on a side (a quarter of the original)."""

FINDINGS_PER_STUDY = {3: 0.45, 4: 0.4, 5: 0.15}
"""chosen: plausible. At least 3, so a negation question has three present findings beside an absent one."""

LUNG_ZONES = (
    "right upper lung zone",
    "right mid lung zone",
    "right lower lung zone",
    "left upper lung zone",
    "left mid lung zone",
    "left lower lung zone",
)
SIDES = ("right", "left")
SIZES = ("Small", "Moderate", "Large", "Marked")
"""chosen: plausible. The four answers of a size (geometric) question; each is drawn at its own scale."""


@dataclass(frozen=True)
class FindingKind:
    """One finding a synthetic study may have: how reports name it, what it is filed under, how it is drawn.

    `where` is "zone" (one of `LUNG_ZONES`), "side" (right or left) or "" (central: one place);
    `diagnosis` is what a differential-diagnosis question offers for it (None: never asked).
    """

    name: str
    category: str
    subcategory: str
    drawing: str
    where: str = ""
    sized: bool = True
    diagnosis: str | None = None


FINDINGS: tuple[FindingKind, ...] = (
    FindingKind(
        "lobar consolidation",
        "Lung and Pleural Opacity",
        "Airspace Opacity",
        "opacity",
        "zone",
        True,
        "Bacterial pneumonia",
    ),
    FindingKind(
        "ground-glass opacity", "Ground-Glass Opacity", "Hazy Opacity", "haze", "zone", True, "Viral pneumonitis"
    ),
    FindingKind(
        "subsegmental atelectasis",
        "Atelectasis and Volume Loss",
        "Plate-like Atelectasis",
        "band",
        "zone",
        True,
        "Postoperative hypoventilation",
    ),
    FindingKind(
        "pulmonary nodule",
        "Pulmonary Nodules",
        "Solitary Nodule",
        "nodule",
        "zone",
        True,
        "Early bronchogenic carcinoma",
    ),
    FindingKind("lung mass", "Lung Masses", "Mass Lesion", "mass", "zone", True, "Advanced lung cancer"),
    FindingKind(
        "cavitary lesion", "Cavitation", "Cavitary Lesion", "cavity", "zone", True, "Reactivation tuberculosis"
    ),
    FindingKind(
        "calcified granuloma", "Calcifications", "Granuloma", "calcification", "zone", False, "Healed histoplasmosis"
    ),
    FindingKind(
        "reticular opacities",
        "Interstitial Lung Disease",
        "Reticular Pattern",
        "reticular",
        "zone",
        True,
        "Idiopathic pulmonary fibrosis",
    ),
    FindingKind("emphysematous bulla", "Emphysema", "Bullous Disease", "bulla", "zone", True, "Bullous emphysema"),
    FindingKind("rib fracture", "Osseous Structures", "Rib Fracture", "fracture", "zone", False, "Blunt chest trauma"),
    FindingKind(
        "surgical clips", "Surgical Material", "Surgical Clips", "clips", "zone", False, "Prior lung resection"
    ),
    FindingKind(
        "miliary nodules", "Miliary Pattern", "Diffuse Micronodules", "miliary", "", False, "Miliary tuberculosis"
    ),
    FindingKind("pleural effusion", "Pleural Effusion", "Effusion", "effusion", "side", True, "Parapneumonic effusion"),
    FindingKind(
        "pneumothorax", "Pneumothorax", "Pneumothorax", "pneumothorax", "side", True, "Spontaneous pneumothorax"
    ),
    FindingKind(
        "pleural thickening",
        "Pleural Abnormalities",
        "Pleural Thickening",
        "pleural",
        "side",
        True,
        "Asbestos-related pleural disease",
    ),
    FindingKind(
        "elevated hemidiaphragm",
        "Diaphragm",
        "Diaphragmatic Elevation",
        "diaphragm",
        "side",
        True,
        "Phrenic nerve palsy",
    ),
    FindingKind(
        "hilar enlargement", "Hilar Structures", "Hilar Prominence", "hilar", "side", True, "Pulmonary sarcoidosis"
    ),
    FindingKind("chest tube", "Thoracostomy Tubes", "Pleural Drain", "chest_tube", "side", False),
    FindingKind(
        "subcutaneous emphysema",
        "Soft Tissues",
        "Subcutaneous Gas",
        "subcutaneous",
        "side",
        True,
        "Chest wall air leak",
    ),
    FindingKind("cardiomegaly", "Cardiac Silhouette", "Cardiomegaly", "heart", "", True, "Dilated cardiomyopathy"),
    FindingKind(
        "widened mediastinum",
        "Cardiac and Mediastinal",
        "Mediastinal Widening",
        "mediastinum",
        "",
        True,
        "Mediastinal lymphoma",
    ),
    FindingKind(
        "pulmonary edema", "Pulmonary Vasculature", "Interstitial Edema", "edema", "", True, "Congestive heart failure"
    ),
    FindingKind(
        "hyperinflation",
        "Lung Volumes",
        "Hyperinflation",
        "hyperinflation",
        "",
        False,
        "Chronic obstructive pulmonary disease",
    ),
    FindingKind("low lung volumes", "Exam/Patient Information", "Inspiratory Effort", "low_volumes", "", False),
    FindingKind("pneumoperitoneum", "Upper Abdomen", "Free Air", "free_air", "", True, "Perforated hollow viscus"),
    FindingKind(
        "hiatal hernia", "Gastrointestinal", "Hiatal Hernia", "hernia", "", True, "Gastroesophageal reflux disease"
    ),
    FindingKind(
        "aortic knob calcification", "Aorta", "Aortic Calcification", "aorta", "", False, "Aortic atherosclerosis"
    ),
    FindingKind(
        "tracheal deviation", "Airway", "Tracheal Shift", "trachea", "", False, "Mass effect from a thyroid goiter"
    ),
    FindingKind(
        "thoracic scoliosis", "Thoracic Cage", "Spinal Curvature", "scoliosis", "", False, "Idiopathic scoliosis"
    ),
    FindingKind(
        "degenerative spine changes", "Spine", "Degenerative Changes", "spine", "", False, "Thoracic spondylosis"
    ),
    FindingKind("endotracheal tube", "Devices and Lines", "Airway Device", "endotracheal", "", False),
    FindingKind("central venous catheter", "Vascular Access", "Central Line", "central_line", "", False),
    FindingKind("nasogastric tube", "Enteric Tubes", "Feeding Tube", "nasogastric", "", False),
    FindingKind("cardiac pacemaker", "Cardiac Devices", "Pacemaker", "pacemaker", "", False),
    FindingKind("sternotomy wires", "Postsurgical Changes", "Median Sternotomy", "sternotomy", "", False),
)
"""chosen: plausible. 34 categories (and "Negation", which every negation question is filed under:
formats.md, about 35 in all); names from formats.md and the sample where they give one ("Lung and Pleural
Opacity", "Airspace Opacity", "Cardiac and Mediastinal", "Devices and Lines", "Exam/Patient Information")."""

NEGATION_CATEGORY = "Negation"
"""formats.md: the category of negation questions."""

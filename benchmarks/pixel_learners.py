"""The learners `benchmarks.pixel_signal` trains to answer a question from its image and what it names, from a
plain CNN over the pixels to the probe's own decoder over its image tokens: each a shape whose examples-to-answer
tell what a mark costs to read apart from what the shape costs (the module `pixel_signal` says which is which)."""

from __future__ import annotations

import string
from pathlib import Path

import torch
from torch import nn


class AnswerNet(nn.Module):
    """A small CNN over the grey image and two coordinate channels (so a region can be found by where it is),
    modulated half-way (FiLM) by the sum of the embeddings of what the question names, max- and mean-pooled,
    then one score per option text."""

    reads_options = False

    def __init__(self, conditions: int, options: int, width: int = 16, region_mask: bool = False):
        super().__init__()
        self.region_mask = region_mask

        def block(cin: int, cout: int, stride: int) -> nn.Sequential:
            return nn.Sequential(nn.Conv2d(cin, cout, 3, stride, 1), nn.BatchNorm2d(cout), nn.ReLU())

        self.stem = nn.Sequential(
            block(4 if region_mask else 3, width, 2), block(width, 2 * width, 2), block(2 * width, 2 * width, 1)
        )
        self.film = nn.Embedding(conditions, 4 * width)
        nn.init.zeros_(self.film.weight)
        self.head = nn.Sequential(block(2 * width, 4 * width, 2), block(4 * width, 4 * width, 1))
        self.condition = nn.Embedding(conditions, 8 * width)
        self.out = nn.Sequential(nn.ReLU(), nn.Linear(8 * width, options))

    def forward(
        self, images: torch.Tensor, conditions: torch.Tensor, masks: torch.Tensor | None = None
    ) -> torch.Tensor:
        b, _, h, w = images.shape
        ys = torch.linspace(-1, 1, h).view(1, 1, h, 1).expand(b, 1, h, w)
        xs = torch.linspace(-1, 1, w).view(1, 1, 1, w).expand(b, 1, h, w)
        x = self.stem(torch.cat([images, ys, xs] + ([masks] if masks is not None else []), 1))
        gamma, beta = self.film(conditions).sum(1).chunk(2, dim=1)
        x = x * (1 + gamma[:, :, None, None]) + beta[:, :, None, None]
        x = self.head(x)
        pooled = torch.cat([x.amax((2, 3)), x.mean((2, 3))], 1)
        return self.out(pooled + self.condition(conditions).sum(1))


class GridNet(nn.Module):
    """The image (and the named region's mask) averaged over a `grid` x `grid` grid of cells, every cell an input
    of a two-layer perceptron, plus the sum of the embeddings of what the question names; one score per option
    text. A mark's place is where it lands in the input, so nothing about position has to be learnt."""

    reads_options = False

    def __init__(
        self,
        conditions: int,
        options: int,
        hidden: int = 256,
        region_mask: bool = False,
        grid: int = 28,
        inputs: int | None = None,
    ):
        super().__init__()
        self.region_mask, self.grid = region_mask, grid
        self.cells = nn.Linear(inputs or (2 if region_mask else 1) * grid * grid, hidden)
        self.condition = nn.Embedding(conditions, hidden)
        self.out = nn.Sequential(nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU(), nn.Linear(hidden, options))

    def forward(
        self, images: torch.Tensor, conditions: torch.Tensor, masks: torch.Tensor | None = None
    ) -> torch.Tensor:
        x = images if masks is None else torch.cat([images, masks], 1)
        return self.scores(nn.functional.adaptive_avg_pool2d(x, self.grid).flatten(1), conditions)

    def scores(self, inputs: torch.Tensor, conditions: torch.Tensor) -> torch.Tensor:
        return self.out(self.cells(inputs) + self.condition(conditions).sum(1))


class TokensNet(GridNet):
    """The grid's perceptron over an image's tokens encoded once (`probe_tokens`: one vector of `inputs` features
    an image) in place of its cells."""

    def __init__(self, inputs: int, conditions: int, options: int, hidden: int = 256):
        super().__init__(conditions, options, hidden, inputs=inputs)

    def forward(self, tokens: torch.Tensor, conditions: torch.Tensor, masks: None = None) -> torch.Tensor:
        return self.scores(tokens.flatten(1), conditions)


class AttentionNet(nn.Module):
    """The probe's decoder less its text: a causal transformer at the tokens' width over an image's tokens
    (`probe_tokens`), then one token for each thing the question names, then a query token whose output scores
    the options. The perceptron sees every token at once; here the query must learn to attend, from what the
    question names, to the image tokens that hold its answer, as the probe's answer must."""

    region_mask = False
    reads_options = False

    def __init__(self, width: int, conditions: int, options: int, layers: int = 2, heads: int = 4):
        super().__init__()
        self.tokens = nn.Linear(width, width)
        self.condition = nn.Embedding(conditions, width)
        self.query = nn.Parameter(0.5 * torch.randn(1, 1, width))
        layer = nn.TransformerEncoderLayer(width, heads, 2 * width, dropout=0.0, batch_first=True, norm_first=True)
        self.body = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.out = nn.Sequential(nn.LayerNorm(width), nn.Linear(width, options))

    def forward(self, tokens: torch.Tensor, conditions: torch.Tensor, masks: None = None) -> torch.Tensor:
        return self.answer([self.tokens(tokens), self.condition(conditions)])

    def answer(self, parts: list[torch.Tensor]) -> torch.Tensor:
        """The query's output after `parts` (each `batch x tokens x width`)."""
        return self.out(self.read(torch.cat([*parts, self.query.expand(len(parts[0]), -1, -1)], 1))[:, -1])

    def read(self, sequence: torch.Tensor) -> torch.Tensor:
        """Every token's output, each reading only those before it, as a decoder reads."""
        causal = nn.Transformer.generate_square_subsequent_mask(sequence.shape[1])
        return self.body(sequence, mask=causal, is_causal=True)


class MatchingNet(AttentionNet):
    """The attention learner with ReXVQA's question as the probe reads it: after the image tokens and the task,
    each offered option is a token (its text's embedding plus its letter's), and the query's output is a letter.
    The attention learner is handed the option texts as its outputs; this one must find each offered option's
    finding among the image tokens and answer the letter it stands at."""

    reads_options = True

    def __init__(self, width: int, conditions: int, options: int, letters: int, layers: int = 2, heads: int = 4):
        super().__init__(width, conditions, letters, layers, heads)
        self.option = nn.Embedding(options + 1, width)
        self.letter = nn.Embedding(letters, width)

    def forward(self, tokens: torch.Tensor, conditions: torch.Tensor, options: torch.Tensor) -> torch.Tensor:
        return self.answer([self.tokens(tokens), self.condition(conditions), self.offered(options)])

    def offered(self, options: torch.Tensor) -> torch.Tensor:
        """One token an offered option: its text's embedding (an unknown text's where -1) plus its letter's."""
        unknown = self.option.num_embeddings - 1
        return self.option(options.masked_fill(options < 0, unknown)) + self.letter.weight[: options.shape[1]]


class PointerNet(MatchingNet):
    """The matching learner with each offered option scored from its own token's output, not a letter from the
    query's: an option's token reads the image and says how well its finding fits, and no later token has to find
    that option again and copy its letter, as a reply's letter must."""

    def __init__(self, width: int, conditions: int, options: int, letters: int, layers: int = 2, heads: int = 4):
        super().__init__(width, conditions, options, letters, layers, heads)
        self.out = nn.Sequential(nn.LayerNorm(width), nn.Linear(width, 1))

    def forward(self, tokens: torch.Tensor, conditions: torch.Tensor, options: torch.Tensor) -> torch.Tensor:
        sequence = torch.cat([self.tokens(tokens), self.condition(conditions), self.offered(options)], 1)
        return self.out(self.read(sequence)[:, -options.shape[1] :]).squeeze(-1)


class VerdictNet(nn.Module):
    """The probe's own decoder (`--probe-model`'s text model and LM head, trained from the weights it has) after
    the same frozen image tokens, asked what a reply that checks each option asks: `between` fixed tokens, the
    task's words, then each offered option as " A: name" in the probe's tokenizer, and after it the verdict
    token, " yes" for the answer (for negation, for the three others: the image shows them) and " no" for the
    rest, trained by the LM's loss on those tokens alone. Where the pointer's layers read one token an option,
    the probe's decoder must join a name's pieces and find its mark past whatever text lies between."""

    reads_options = True

    def __init__(self, probe_model: Path, conditions: list[str], options: list[str], between: int, seed: int):
        super().__init__()
        from transformers import AutoModelForImageTextToText, AutoTokenizer

        model = AutoModelForImageTextToText.from_pretrained(probe_model)
        self.text, self.head = model.model.get_decoder(), model.lm_head
        self.tokenizer = AutoTokenizer.from_pretrained(probe_model)
        yes, no = self.pieces(" yes"), self.pieces(" no")
        shared = 0
        while yes[shared] == no[shared]:
            shared += 1
        self.before_verdict, self.yes, self.no = yes[:shared], yes[shared], no[shared]
        self.negation = [c == "task:Negation Assessment" for c in ["", *conditions]]
        self.task_words = [self.pieces(f" {c.partition(':')[2]}:") for c in ["", *conditions]]
        self.letter_words = [self.pieces(f" {letter}:") for letter in string.ascii_uppercase]
        self.option_words = [self.pieces(f" {o}") for o in options] + [self.pieces(" unknown")]
        ordinary = sorted(set(self.tokenizer.get_vocab().values()) - set(self.tokenizer.all_special_ids))
        drawn = torch.randint(len(ordinary), (between,), generator=torch.Generator().manual_seed(seed))
        self.between = [ordinary[int(i)] for i in drawn]

    def pieces(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=False)

    def spelt(self, conditions: torch.Tensor, options: torch.Tensor) -> tuple[torch.Tensor, list[list[int]]]:
        """Each question's token ids (padded) and the position of each option's verdict among them."""
        rows, slots = [], []
        for task, offered in zip(conditions[:, 0].tolist(), options.tolist()):
            ids, places = self.between + self.task_words[task], []
            for letter, option in zip(self.letter_words, offered):
                ids = ids + letter + self.option_words[option] + self.before_verdict
                places.append(len(ids) - 1)
            rows.append(ids)
            slots.append(places)
        padded = torch.zeros(len(rows), max(map(len, rows)), dtype=torch.long)
        for i, ids in enumerate(rows):
            padded[i, : len(ids)] = torch.tensor(ids)
        return padded, slots

    def verdict_logits(self, tokens: torch.Tensor, conditions: torch.Tensor, options: torch.Tensor) -> torch.Tensor:
        """The LM head's logits at each offered option's verdict (`batch x options x vocabulary`)."""
        ids, slots = self.spelt(conditions, options)
        embedded = torch.cat([tokens, self.text.embed_tokens(ids)], 1)
        hidden = self.text(inputs_embeds=embedded).last_hidden_state
        places = tokens.shape[1] + torch.tensor(slots)
        return self.head(hidden.gather(1, places[..., None].expand(-1, -1, hidden.shape[-1])))

    def forward(self, tokens: torch.Tensor, conditions: torch.Tensor, options: torch.Tensor) -> torch.Tensor:
        logits = self.verdict_logits(tokens, conditions, options)
        shown = logits[..., self.yes] - logits[..., self.no]
        return torch.where(self.negated(conditions), -shown, shown)

    def negated(self, conditions: torch.Tensor) -> torch.Tensor:
        """Whether each question asks for the option its image does not show (`batch x 1`)."""
        return torch.tensor([self.negation[c] for c in conditions[:, 0].tolist()])[:, None]

    def loss(self, tokens: torch.Tensor, conditions: torch.Tensor, options: torch.Tensor, answer: torch.Tensor):
        """The LM's cross-entropy on the verdict tokens of the offered options."""
        logits = self.verdict_logits(tokens, conditions, options)
        is_answer = nn.functional.one_hot(answer, options.shape[1]).bool()
        shown = is_answer ^ self.negated(conditions)
        targets = torch.where(shown, self.yes, self.no).masked_fill(options < 0, -100)
        return nn.functional.cross_entropy(logits.flatten(0, 1), targets.flatten(), ignore_index=-100)

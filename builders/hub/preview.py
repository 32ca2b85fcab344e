"""`cxr-vqa preview`: what a built dataset looks like, boxes included.

The Hub's viewer shows images and text but never draws boxes, while grounding is what
GEMeX is about. A preview is a grid of rows: the image(s) with each box drawn and labelled
with its region, then the question, the choices, the answer and the reason. It comes as a
PNG (PIL) or a self-contained HTML page (images inlined as base64).

Rows are read straight from the shards (no `datasets` cache) and dispatched on their
columns: GEMeX rows have `image`, `regions`, `boxes` (in the stored image's pixels),
`question`, `choices`, `answer`, `reason`; ReXVQA rows have `images` (one per study image),
`view_positions`, `question`, `options`, `answer`, `explanation`.

`add_preview_config` writes a small `preview` config whose images have the boxes drawn in,
so that the viewer itself shows the grounding, plus `preview.png` referenced from the card.
"""

from __future__ import annotations

import base64
import html
import io
import textwrap
from dataclasses import dataclass, field
from itertools import zip_longest
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
from datasets import Features
from PIL import Image, ImageDraw, ImageFont

from builders.assembly.card import config_info, config_record, load_card, set_card_section, update_card
from builders.assembly.report import BuildReport
from builders.assembly.shards import sha256
from builders.built_folder import (
    PREVIEW_IMAGE,
    REPORT,
    card_configs,
    config_shards,
    default_config,
    named_config,
    read_report,
    split_patterns,
)
from builders.files import atomic_path, write_text
from builders.provenance import folder_synthetic, stamp_table

BOX_COLOURS = (
    (230, 25, 75),
    (60, 180, 75),
    (0, 130, 200),
    (245, 130, 48),
    (145, 30, 180),
    (70, 240, 240),
    (240, 50, 230),
)
"""Distinct colours, one per region of a row; the first is red."""
THUMB = 420
PREVIEW_CONFIG = "preview"


@dataclass
class PreviewRow:
    """One question as the preview shows it: drawn images (with captions) and its text."""

    title: str
    images: list[Image.Image | None] = field(default_factory=list)
    captions: list[str] = field(default_factory=list)
    question: str = ""
    choices: list[str] = field(default_factory=list)
    answer: str = ""
    reason: str = ""

    def text_lines(self) -> list[tuple[str, str]]:
        """(label, text) pairs in display order; empty parts left out."""
        lines = [("Q", self.question)]
        lines += [("", f"{chr(65 + i)}. {choice}") for i, choice in enumerate(self.choices)]
        lines += [("Answer", self.answer), ("Reason", self.reason)]
        return [(label, text) for label, text in lines if text]


def _font(size: int) -> ImageFont.ImageFont:
    try:
        return ImageFont.load_default(size=size)
    except TypeError:  # Pillow built without FreeType
        return ImageFont.load_default()


def decode_image(cell: dict | None) -> Image.Image | None:
    """An `Image()` cell ({"bytes", "path"}) as a PIL image; None when neither bytes nor a readable path."""
    if not cell:
        return None
    if cell.get("bytes"):
        return Image.open(io.BytesIO(cell["bytes"]))
    path = cell.get("path")
    if path and Path(path).is_file():
        return Image.open(path)
    return None


def draw_boxes(image: Image.Image, boxes: list[list[float]], regions: list[str], scale: float = 1.0) -> Image.Image:
    """An RGB copy of `image` with each box (xyxy in the image's pixels, times `scale`) drawn and labelled."""
    out = image.convert("RGB")
    draw = ImageDraw.Draw(out)
    width = max(2, round(max(out.size) / 200))
    font = _font(max(11, round(max(out.size) / 32)))
    for k, (box, region) in enumerate(zip_longest(boxes, regions, fillvalue="")):
        if not box:
            continue
        colour = BOX_COLOURS[k % len(BOX_COLOURS)]
        x1, y1, x2, y2 = (v * scale for v in box)
        draw.rectangle((x1, y1, x2, y2), outline=colour, width=width)
        if region:
            left, top, right, bottom = draw.textbbox((0, 0), region, font=font)
            ty = y1 - (bottom - top) - 2 * width if y1 - (bottom - top) - 2 * width >= 0 else y1 + width
            draw.rectangle((x1, ty, x1 + right - left + 2 * width, ty + bottom - top + 2 * width), fill=colour)
            draw.text((x1 + width - left, ty + width - top), region, fill=(255, 255, 255), font=font)
    return out


def thumbnail(image: Image.Image, boxes: list, regions: list, size: int) -> Image.Image:
    """`image` fitted into `size` x `size`, boxes drawn after scaling so lines keep one width."""
    scale = min(size / image.width, size / image.height)
    small = image.convert("RGB").resize(
        (max(1, round(image.width * scale)), max(1, round(image.height * scale))), Image.LANCZOS
    )
    return draw_boxes(small, boxes or [], regions or [], scale)


def preview_row(row: dict, size: int = THUMB) -> PreviewRow:
    """A shard row (GEMeX or ReXVQA, told apart by its columns) as a `PreviewRow`."""
    title = str(row.get("question_id", ""))
    if "images" in row:  # ReXVQA: a study's images side by side, no boxes
        images = [decode_image(cell) for cell in row.get("images") or []]
        views = row.get("view_positions") or []
        width = size // max(1, len(images))
        drawn = [thumbnail(im, [], [], width) if im else None for im in images]
        captions = [str(v or "") for v, _ in zip_longest(views, images)][: len(images)]
        return PreviewRow(
            title,
            drawn,
            captions,
            row.get("question") or "",
            list(row.get("options") or []),
            str(row.get("answer") or ""),
            row.get("explanation") or "",
        )
    image = decode_image(row.get("image"))
    regions = list(row.get("regions") or [])
    drawn = thumbnail(image, row.get("boxes") or [], regions, size) if image else None
    caption = (
        ", ".join(regions)
        if drawn is not None
        else "no image in this build" + (f" ({', '.join(regions)})" if regions else "")
    )
    return PreviewRow(
        title,
        [drawn],
        [caption],
        row.get("question") or "",
        list(row.get("choices") or []),
        str(row.get("answer") or ""),
        row.get("reason") or "",
    )


def read_rows(folder: Path, n: int = 16, config: str | None = None, split: str | None = None) -> list[dict]:
    """Up to `n` rows of one config and split, taken in turn from each of its files and, where
    the card's configs select rows by a column (a shared shard set), from each value of it: every type shows."""
    configs, _ = card_configs(Path(folder))
    name = config or default_config(configs)
    shards = config_shards(Path(folder), named_config(folder, configs, name))
    split = split or ("test" if "test" in shards else next(iter(shards)))
    if not shards.get(split):
        raise ValueError(
            f"{folder}: config {name!r} has no split {split!r} (splits: {', '.join(s for s in shards if shards[s])})"
        )
    own = configs[name].get("filters")
    selectors = {c["filters"][0][0] for c in configs.values() if c.get("filters")}
    per_file = -(-n // len(shards[split]))
    want = per_file if not (own or selectors) else 4 * per_file
    tables = [_first_rows(path, want, pq.filters_to_expression(own) if own else None) for path in shards[split]]
    mixed = [row for group in zip_longest(*tables) for row in group if row is not None]
    if selectors and not own:
        column = sorted(selectors)[0]
        kinds: dict = {}
        for row in mixed:
            kinds.setdefault(row.get(column), []).append(row)
        mixed = [row for group in zip_longest(*kinds.values()) for row in group if row is not None]
    return mixed[:n]


def _first_rows(path: Path, n: int, matching=None) -> list[dict]:
    """The first `n` rows of one shard (those matching the expression `matching`, if given)."""
    taken: list[dict] = []
    for batch in pq.ParquetFile(path).iter_batches(batch_size=n):
        table = pa.Table.from_batches([batch])
        taken += (table.filter(matching) if matching is not None else table).to_pylist()
        if len(taken) >= n:
            break
    return taken[:n]


def render_png(rows: list[PreviewRow], out: Path, columns: int = 4, size: int = THUMB) -> Path:
    """The rows as a grid, one cell per question: image(s) on top, text below."""
    pad, font, bold = 10, _font(14), _font(15)
    wrap = max(20, (size - 2 * pad) // 8)
    cell_texts = [
        [
            (label, line)
            for label, text in row.text_lines()
            for line in textwrap.wrap(f"{label + ': ' if label else ''}{text}", wrap) or [""]
        ]
        for row in rows
    ]
    line_h = 19
    text_h = max((len(t) for t in cell_texts), default=0) * line_h + 2 * line_h
    cell_w, cell_h = size + 2 * pad, size + text_h + 2 * pad
    cols = min(columns, max(1, len(rows)))
    grid = Image.new("RGB", (cols * cell_w, -(-len(rows) // cols) * cell_h), (255, 255, 255))
    draw = ImageDraw.Draw(grid)
    for k, (row, lines) in enumerate(zip(rows, cell_texts)):
        x0, y0 = (k % cols) * cell_w + pad, (k // cols) * cell_h + pad
        draw.rectangle((x0, y0, x0 + size - 1, y0 + size - 1), fill=(40, 40, 40))
        x = x0
        for image, caption in zip(row.images, row.captions):
            if image is not None:
                grid.paste(image, (x, y0))
                x += image.width
            else:
                draw.text((x + pad, y0 + size // 2), caption or "no image", fill=(230, 230, 230), font=font)
        y = y0 + size + 4
        title = row.title if len(row.title) <= wrap else "…" + row.title[-(wrap - 1) :]
        draw.text((x0, y), title, fill=(110, 110, 110), font=font)
        caption = " | ".join(c for c in row.captions if c) if any(row.images) else ""
        y += line_h
        if caption:
            draw.text((x0, y), textwrap.shorten(caption, wrap), fill=(110, 110, 110), font=font)
            y += line_h
        for label, line in lines:
            draw.text((x0, y), line, fill=(0, 0, 0), font=bold if label in ("Q", "Answer") else font)
            y += line_h
    with atomic_path(out) as temp:
        grid.save(temp, format=Image.registered_extensions()[out.suffix.lower()])
    return out


def _data_uri(image: Image.Image) -> str:
    buffer = io.BytesIO()
    image.save(buffer, format="PNG", optimize=True)
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode("ascii")


HTML_STYLE = """
body { font-family: system-ui, sans-serif; margin: 16px; background: #fff; color: #111; }
.grid { display: grid; grid-template-columns: repeat(auto-fill, minmax(%dpx, 1fr)); gap: 16px; }
.row { border: 1px solid #ccc; border-radius: 6px; padding: 8px; }
.images { display: flex; gap: 4px; background: #282828; min-height: 120px; }
figure { margin: 0; } figcaption { font-size: 12px; color: #555; }
.title { font-size: 11px; color: #777; word-break: break-all; }
ol { margin: 4px 0; padding-left: 22px; } .answer { font-weight: 600; } .reason { color: #333; }
"""


def render_html(rows: list[PreviewRow], out: Path, source: str = "") -> Path:
    """The rows as one self-contained HTML page: every image inlined, no external request."""
    cells = []
    for row in rows:
        figures = "".join(
            f'<figure><img src="{_data_uri(im)}" alt="{html.escape(cap)}" width="{im.width}" height="{im.height}">'
            f"<figcaption>{html.escape(cap)}</figcaption></figure>"
            if im is not None
            else f'<figure><figcaption style="color:#ddd;padding:8px">{html.escape(cap or "no image")}</figcaption></figure>'
            for im, cap in zip(row.images, row.captions)
        )
        choices = "".join(f"<li>{html.escape(c)}</li>" for c in row.choices)
        cells.append(
            f'<div class="row"><div class="images">{figures}</div><div class="title">{html.escape(row.title)}</div>'
            f"<p><b>Q:</b> {html.escape(row.question)}</p>"
            + (f'<ol type="A">{choices}</ol>' if choices else "")
            + f'<p class="answer">Answer: {html.escape(row.answer)}</p>'
            + (f'<p class="reason">Reason: {html.escape(row.reason)}</p>' if row.reason else "")
            + "</div>"
        )
    page = (
        f'<!doctype html><html><head><meta charset="utf-8"><title>Preview {html.escape(source)}</title>'
        f"<style>{HTML_STYLE % (THUMB + 20)}</style></head><body><h1>Preview: {html.escape(source)}</h1>"
        f'<div class="grid">{"".join(cells)}</div></body></html>\n'
    )
    write_text(out, page)
    return out


def write_preview(
    folder: Path, out: Path, n: int = 16, config: str | None = None, split: str | None = None
) -> tuple[Path, int]:
    """Render up to `n` rows of a built folder to `out` (.png or .html); the file and the rows it shows
    (fewer than `n` where the split holds fewer)."""
    out = Path(out)
    if out.suffix.lower() not in (".png", ".html", ".htm"):
        raise ValueError(f"{out}: the preview is written as .png or .html")
    rows = [preview_row(r) for r in read_rows(Path(folder), n, config, split)]
    if out.suffix.lower() == ".png":
        return render_png(rows, out), len(rows)
    return render_html(rows, out, source=Path(folder).name), len(rows)


def boxed_image_cell(row: dict) -> dict:
    """The row's `image` cell with its boxes drawn in, as PNG bytes."""
    image = decode_image(row.get("image"))
    if image is None:
        raise ValueError(
            f"row {row.get('question_id')}: its image cannot be read (a reference build on another machine?)"
        )
    drawn = draw_boxes(image, row.get("boxes") or [], row.get("regions") or [])
    buffer = io.BytesIO()
    drawn.save(buffer, format="PNG")
    return {"bytes": buffer.getvalue(), "path": row.get("image_path") or (row["image"] or {}).get("path")}


def exclude_file(folder: Path, configs: dict[str, dict], new: Path, keep: str) -> dict[str, dict]:
    """Configs other than `keep` whose globs would read `new`, rewritten to list the other configs' globs instead.

    `default` reads `data/<split>/*.parquet`; a preview shard there must not join it. Raises
    ValueError if the rewrite would change which other files a config reads.
    """
    changed = {}
    for name, config in configs.items():
        if name == keep or new not in {p for ps in config_shards(folder, config).values() for p in ps}:
            continue
        entries = []
        for split, patterns in _split_entries(config):
            before = {p for pattern in patterns for p in folder.glob(pattern)} - {new}
            if new not in {p for pattern in patterns for p in folder.glob(pattern)}:
                entries.append({"split": split, "path": patterns})
                continue
            others = sorted(
                {
                    pat
                    for other, c in configs.items()
                    if other not in (name, keep)
                    for s, pats in _split_entries(c)
                    if s == split
                    for pat in pats
                    if new not in set(folder.glob(pat))
                }
            )
            if {p for pattern in others for p in folder.glob(pattern)} != before:
                raise ValueError(f"config {name!r}: cannot leave {new.relative_to(folder)} out of its files")
            entries.append({"split": split, "path": others})
        changed[name] = {**{k: v for k, v in config.items() if k != "data_files"}, "data_files": entries}
    return changed


def _split_entries(config: dict) -> list[tuple[str, list[str]]]:
    return list(split_patterns(config).items())


def add_preview_config(folder: Path, n: int = 8, split: str | None = None, image: bool = True) -> Path:
    """Write the `preview` config (`data/<split>/preview-00000-of-00001.parquet`, boxes drawn into the images).

    Also renders `preview.png` and references it from the card when `image` is true; callers
    decide whether a card may show it (publishing never shows a real build's images publicly).
    """
    folder = Path(folder)
    read_report(folder)  # the preview's files are recorded there, or they would never be uploaded
    configs, _ = card_configs(folder)
    base = {name: c for name, c in configs.items() if name != PREVIEW_CONFIG}
    shards = config_shards(folder, base[default_config(base)])
    split = split or ("test" if shards.get("test") else next(s for s in shards if shards[s]))
    if not shards.get(split):
        raise ValueError(f"{folder}: no split {split!r} to take preview rows from")
    schema = pq.read_schema(shards[split][0])
    if "image" not in schema.names:
        raise ValueError(f"{folder}: no image column (built with --image-mode none), so no boxes to draw in")
    rows = read_rows(folder, n, default_config(base), split)
    for row in rows:
        row["image"] = boxed_image_cell(row)
    target = folder / "data" / split / f"{PREVIEW_CONFIG}-00000-of-00001.parquet"
    table = stamp_table(pa.Table.from_pylist(rows, schema=schema), synthetic=folder_synthetic(folder))
    with atomic_path(target) as temp:
        pq.write_table(table, temp, compression="zstd")

    card = load_card(folder)
    new_configs = exclude_file(folder, base, target, PREVIEW_CONFIG)
    new_configs[PREVIEW_CONFIG] = {"data_files": [{"split": split, "path": f"data/{split}/{PREVIEW_CONFIG}-*.parquet"}]}
    info = config_info(
        {split: [target]},
        Features.from_arrow_schema(schema),
        description="A few rows whose images have the boxes drawn in, for the dataset viewer.",
    )
    update_card(card, configs=new_configs, infos={PREVIEW_CONFIG: info})
    if image:
        write_preview(folder, folder / PREVIEW_IMAGE, n=n, split=split)
        set_card_section(card, "preview", preview_section())
    added = [target, folder / PREVIEW_IMAGE] if image else [target]
    checksums = {path.relative_to(folder).as_posix(): sha256(path) for path in added}
    BuildReport.add_files(
        folder / REPORT,
        {k: v for k, v in checksums.items() if k.startswith("data/")},
        {k: v for k, v in checksums.items() if not k.startswith("data/")},
        PREVIEW_CONFIG,
        config_record(folder, new_configs[PREVIEW_CONFIG], info),
    )
    write_text(folder / "README.md", str(card))
    return target


def preview_section() -> str:
    return (
        f"![Rows of this build with their boxes drawn]({PREVIEW_IMAGE})\n\n"
        f"Rows of this build with each box drawn and labelled with its region (`cxr-vqa preview`). "
        f"The `{PREVIEW_CONFIG}` config holds a few rows whose images have the boxes drawn in, so the "
        f"dataset viewer shows the grounding."
    )

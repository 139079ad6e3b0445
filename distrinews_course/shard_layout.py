"""What a sharded checkpoint holds on disk, read from DCP's own .metadata, and the picture of it: every rank's file as a
row of byte ranges (weights, AdamW's two moments, the rest), and one tensor's rows as they were saved by one world
size and as another world size loads them.

    lay = layout(folder)                    # per file: its byte ranges; per tensor: its saved chunks
    lay.saved_by_fsdp2(world)               # every tensor cut by rows as FSDP2 cuts it on `world` ranks
    plot_layout(lay, load_world=4)          # the figure
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass
from pathlib import Path

KINDS = ("weights", "exp_avg", "exp_avg_sq", "other")
COLOURS = {"weights": "tab:blue", "exp_avg": "tab:orange", "exp_avg_sq": "tab:green", "other": "tab:grey"}


def kind_of(fqn: str) -> str:
    if fqn.startswith("model."):
        return "weights"
    for moment in ("exp_avg_sq", "exp_avg"):
        if fqn.endswith("." + moment):
            return moment
    return "other"  # AdamW's step counters, the training state, the model's description


@dataclass(frozen=True)
class Piece:
    fqn: str
    file: str
    offset: int  # bytes into the file
    length: int
    rows: tuple  # (first row, one past the last) of the tensor this piece holds; () for non-tensors


@dataclass
class Layout:
    folder: Path
    pieces: list  # every Piece, in file order
    sizes: dict  # fqn -> the whole tensor's shape

    @property
    def files(self) -> list:
        return sorted({p.file for p in self.pieces})

    def bytes_by_kind(self, file: str) -> dict:
        out = dict.fromkeys(KINDS, 0)
        for p in self.pieces:
            if p.file == file:
                out[kind_of(p.fqn)] += p.length
        return out

    def chunks(self, fqn: str) -> list:
        return sorted((p for p in self.pieces if p.fqn == fqn), key=lambda p: p.rows)

    def saved_by_fsdp2(self, world: int) -> bool:
        """Every multi-row tensor is saved as FSDP2 shards it on `world` ranks: rank r's rows, one piece each."""
        for fqn, size in self.sizes.items():
            if len(size) < 1 or kind_of(fqn) == "other":
                continue
            want = [r for r in fsdp2_rows(size[0], world) if r[1] > r[0]]
            if [p.rows for p in self.chunks(fqn)] != want:
                return False
        return True


def fsdp2_rows(n: int, world: int) -> list:
    """The rows [start, stop) rank r holds of a tensor of n rows: torch.chunk's cut, as FSDP2 shards dim 0 (each rank
    ceil(n / world) rows, the last ones fewer, or none)."""
    per = math.ceil(n / world)
    return [(min(r * per, n), min((r + 1) * per, n)) for r in range(world)]


def layout(folder) -> Layout:
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        md = FileSystemReader(str(folder)).read_metadata()
    sizes = {k: tuple(v.size) for k, v in md.state_dict_metadata.items() if isinstance(v, TensorStorageMetadata)}
    pieces = []
    for index, info in md.storage_data.items():
        size = sizes.get(index.fqn)
        rows = ()
        if size:  # a tensor's chunk: its rows, from the chunk's offset and size in the metadata
            chunk = next(c for c in md.state_dict_metadata[index.fqn].chunks if c.offsets == index.offset)
            rows = (int(chunk.offsets[0]), int(chunk.offsets[0]) + int(chunk.sizes[0]))
        pieces.append(Piece(index.fqn, info.relative_path, info.offset, info.length, rows))
    return Layout(Path(folder), sorted(pieces, key=lambda p: (p.file, p.offset)), sizes)


def plot_layout(lay: Layout, load_world: int, fqn: str = "model.distilbert.embeddings.word_embeddings.weight"):
    """Left: each file's bytes by kind. Right: `fqn`'s rows as saved (one bar per file) and as `load_world` ranks
    load them, each new shard linked to the saved pieces it reads."""
    from distrinews_course.plots import _pyplot

    plt = _pyplot()
    fig, (ax_files, ax_rows) = plt.subplots(1, 2, figsize=(11, 3.4), gridspec_kw={"width_ratios": [1, 1.2]})
    widest = 0.0
    for y, file in enumerate(lay.files):
        left = 0.0
        for kind, n in lay.bytes_by_kind(file).items():
            ax_files.barh(y, n / 2**20, left=left, color=COLOURS[kind], label=kind if y == 0 else None)
            left += n / 2**20
        widest = max(widest, left)
    ax_files.set(
        yticks=range(len(lay.files)),
        yticklabels=lay.files,
        xlabel="MiB in the file",
        xlim=(0, 1.5 * widest),
        title=f"{lay.folder.name}: one file per saving rank",
    )
    ax_files.invert_yaxis()
    ax_files.legend(fontsize=8, loc="center right")

    n_rows = lay.sizes[fqn][0]
    saved = lay.chunks(fqn)
    for i, p in enumerate(saved):
        ax_rows.barh(1, p.rows[1] - p.rows[0], left=p.rows[0], color=f"C{i}", edgecolor="k", height=0.5)
        ax_rows.text(
            sum(p.rows) / 2, 1, f"{p.file}\nrows {p.rows[0]:,}-{p.rows[1] - 1:,}", ha="center", va="center", fontsize=7
        )
    for r, (a, b) in enumerate(fsdp2_rows(n_rows, load_world)):
        ax_rows.barh(0, b - a, left=a, color="white", edgecolor="k", height=0.5)
        ax_rows.text((a + b) / 2, 0, f"rank {r}\nrows {a:,}-{b - 1:,}", ha="center", va="center", fontsize=7)
        for i, p in enumerate(saved):  # an arrow from each saved piece this rank reads rows of
            lo, hi = max(a, p.rows[0]), min(b, p.rows[1])
            if lo < hi:
                ax_rows.annotate(
                    "",
                    xy=((lo + hi) / 2, 0.27),
                    xytext=((lo + hi) / 2, 0.73),
                    arrowprops={"arrowstyle": "->", "color": f"C{i}", "lw": 1.5},
                )
    ax_rows.set(
        yticks=[0, 1],
        yticklabels=[f"loaded by\n{load_world} ranks", f"saved by\n{len(saved)} ranks"],
        xlabel=f"row of {fqn.split('.')[-2]} ({n_rows:,} x {lay.sizes[fqn][1]})",
        xlim=(0, n_rows),
        ylim=(-0.4, 1.4),
        title="one tensor, resharded on load: each arrow is a byte range read",
    )
    fig.tight_layout()
    return fig

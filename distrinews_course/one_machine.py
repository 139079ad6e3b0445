"""Chapter 08's reference for its two-node run: the same job on one machine (torchrun --standalone, two processes, no
kill), trained and compared tensor by tensor with the checkpoint of the two-node run that lost a node.

    same = OneMachine.train(out / "standalone", train_args, run_dir, timeout=240)
    print(same.line()); settle(same.claims())
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from .claims import Claim


@dataclass
class OneMachine:
    """The same job on one machine (torchrun --standalone, two processes, no kill), against the two-node run that
    lost a node: tensors bit-identical, how far training moved the weights from the seed's, what it learned."""

    seconds: float
    same: int  # tensors bit-identical to the two-node run's
    tensors: int
    moved_l2: float  # how far training moved the two-node run's weights from the same seed's initial ones
    moved: int  # tensors that training changed
    accuracy: float
    val_loss: float
    val_examples: int

    @classmethod
    def train(cls, ref_dir, train_args, two_node_run_dir, *, timeout: float) -> "OneMachine":
        import shutil

        from .launch import torchrun

        ref_dir = Path(ref_dir)
        shutil.rmtree(ref_dir, ignore_errors=True)
        args = [*train_args, "--output", ref_dir, "--checkpoint", ref_dir / "model.pt"]
        one = torchrun("scripts/train_ddp.py", 2, args, timeout=timeout, echo=False)
        return cls.compare(ref_dir / "model.pt", Path(two_node_run_dir), one.seconds)

    @classmethod
    def compare(cls, ref_checkpoint, run_dir, seconds: float) -> "OneMachine":
        import math

        import torch

        from distrinews_lib.data.texts import AG_NEWS_LABELS
        from distrinews_lib.models.build import build_model
        from distrinews_lib.training.config import RunConfig

        from .plots import load_metrics

        def load(path):
            return torch.load(path, map_location="cpu", weights_only=True)

        a, saved = load(ref_checkpoint)["state_dict"], load(run_dir / "model.pt")
        b, meta = saved["state_dict"], saved["metadata"]
        init = build_model(RunConfig(model=meta["model"], seed=meta["seed"]), AG_NEWS_LABELS)[0].state_dict()
        moved = math.sqrt(
            sum(float((b[k].double() - init[k].double()).pow(2).sum()) for k in b if b[k].is_floating_point())
        )
        last = load_metrics(run_dir)["epochs"][-1]
        return cls(
            seconds=seconds,
            same=sum(k in b and torch.equal(a[k], b[k]) for k in a),
            tensors=len(a),
            moved_l2=moved,
            moved=sum(not torch.equal(b[k], init[k]) for k in b),
            accuracy=last["val_accuracy"],
            val_loss=last["val_loss"],
            val_examples=last["val_examples"],
        )

    def line(self) -> str:
        import math

        return (
            f"one machine, 2 processes: {self.seconds:.1f} s; {self.same}/{self.tensors} tensors bit-identical to the "
            f"two-node run that lost node1\ntraining moved {self.moved}/{self.tensors} tensors, by L2 "
            f"{self.moved_l2:.3g} in all; validation accuracy {100 * self.accuracy:.1f}% on {self.val_examples} texts, "
            f"loss {self.val_loss:.3f} (chance: 25%, ln 4 = {math.log(4):.3f})"
        )

    def claims(self) -> list[Claim]:
        """Training moved every tensor (equal weights prove little if they never left the seed's), the run learned
        (above chance by 10 points, a loss 0.05 below ln 4, a uniform guess's), and the weights are bit-identical."""
        import math

        return [
            Claim(
                f"training moved every one of the {self.tensors} tensors (L2 {self.moved_l2:.3g})",
                self.moved == self.tensors and self.moved_l2 > 1.0,
            ),
            Claim(
                f"the run that lost a node learned: {100 * self.accuracy:.1f}% on held-out texts, well above chance, "
                "and a loss below ln 4",
                self.accuracy > 0.35 and self.val_loss < math.log(4) - 0.05,
            ),
            Claim(
                "two nodes that lost one of them end exactly where one machine with two processes ends "
                f"({self.same}/{self.tensors} tensors bit-identical)",
                self.same == self.tensors,
            ),
        ]

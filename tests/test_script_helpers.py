"""The helpers train_single.py and train_ddp.py call in one line each: config.setup (flags, then --threads),
precision.compile_if_asked (--compile) and flops.model_mfu (the epoch line's MFU)."""

from types import SimpleNamespace

import pytest
import torch

from distrinews_lib.training import config, flops, precision


@pytest.fixture
def threads():
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


def test_setup_sets_the_threads_it_was_given_and_leaves_them_otherwise(threads):
    start = torch.get_num_threads()
    other = 1 if start != 1 else 2
    assert config.setup("t", ["--config", "cpu_smoke", "--threads", str(other)]).threads == other
    assert torch.get_num_threads() == other
    torch.set_num_threads(start)
    cfg = config.setup("t", ["--config", "cpu_smoke"])
    assert cfg == config.parse("t", ["--config", "cpu_smoke"]) and torch.get_num_threads() == start


def test_compile_if_asked_wraps_only_when_asked():
    model = torch.nn.Linear(2, 2)
    assert precision.compile_if_asked(model, SimpleNamespace(compile=False, compile_mode="default")) is model
    wrapped = precision.compile_if_asked(model, SimpleNamespace(compile=True, compile_mode="default"))
    assert wrapped is not model and wrapped._orig_mod is model  # torch.compile is lazy: nothing compiles here


class _Encoder(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.config = SimpleNamespace(n_layers=2, dim=8)
        self.emb, self.lin = torch.nn.Embedding(10, 8), torch.nn.Linear(8, 8)


def test_model_mfu_is_the_formula_over_the_device_peak(monkeypatch):
    model = _Encoder()
    stats = SimpleNamespace(tokens=1000, sum_sq_len=50_000, seconds=2.0)
    amp = SimpleNamespace(mode="off")
    assert flops.model_mfu(stats, model, amp) is None  # a CPU has no peak
    monkeypatch.setattr(flops, "device_peak", lambda device, mode: 1e-6)  # 1 MFLOP/s, in TFLOP/s
    expected = (6 * 72 * 1000 + 12 * 2 * 8 * 50_000) / 2.0 / 1e6  # 72 = 8*8+8 non-embedding weights
    assert flops.model_mfu(stats, model, amp) == pytest.approx(expected)
    assert flops.model_mfu(stats, torch.compile(model), amp, 2) == pytest.approx(expected / 2)  # unwrapped, 2 GPUs

"""Helpers around torch.distributed that are not the lesson, in one import for a script (`from distrinews_lib import
distributed as D`). Each is defined where its concern is: process_group/setup.py (who this process is, which backend
and device), ranks.py, collectives.py and ending.py, and devices.py (the device rule, which the server shares). The
library's own modules import the one they need, so a run loads only what it uses. The scripts still call
init_process_group / DDP / destroy_process_group themselves."""

# ruff: noqa: F401  (names handed on to the scripts)
from .devices import gpu_count, resolve_device
from .process_group.collectives import (
    agree,
    all_gather_varlen,
    all_reduce_sum,
    barrier,
    comm_device,
    gather_by_index,
    local_main_first,
    max_param_difference,
    same_on_all_ranks,
)
from .process_group.ending import end_process, run_and_end
from .process_group.ranks import get_rank, get_world_size, is_initialized, is_main, node_name, print0
from .process_group.setup import TorchrunEnv, choose_backend, device_for, free_port, nccl_fits, torchrun_env

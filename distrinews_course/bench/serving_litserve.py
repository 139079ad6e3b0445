"""The LitServe competitor of `scripts/bench_serving.py --litserve`: the same checkpoint served through LitServe's API.

LitServe (Lightning AI; `pip install litserve`, a benchmark dependency in requirements-dev.txt, never needed to serve)
is a FastAPI-based serving engine built for this job: a LitAPI with a batched `predict`, dynamic batching
(`max_batch_size`, `batch_timeout`) and inference workers per device. Here it serves exactly what our server serves:

* the checkpoint loaded and checked by serving.loading.check_for_serving (int8 too, with --quantize int8), and each
  batch classified by the same Classifier.predict (tokenize, one forward pass, softmax);
* the same request and response models: FastAPI validates PredictRequest in LitServe's API process and the answer
  against Prediction, as ours does;
* batching tuned as ours: max_batch_size = our --max-batch-size, batch_timeout = our --batch-window-ms, and a
  request timeout equal to our deadline;
* the same workers: one inference worker (workers_per_device=1) running torch with our server's thread count, and
  one API server process (LitServe's default: as many as inference workers).

What differs is the engine. Ours is one process: the event loop parses requests and a model thread runs batches,
handing texts and answers over in memory. LitServe runs its API server (uvicorn, forked) and the inference worker
(spawned) as separate processes joined by multiprocessing.Manager queues: every request and every answer is pickled
through the manager process, and the API server collects answers with a thread polling its queue.

    python -c "from distrinews_course.bench.serving_litserve import main; main()" --checkpoint PATH --port 8001
"""

# No `from __future__ import annotations`: LitServe reads decode_request's and encode_response's annotations as
# the endpoint's request and response models, and needs the classes, not their names.
import argparse

import litserve as ls
import torch

from distrinews_lib.serving.inference import Classifier
from distrinews_lib.serving.loading import check_for_serving
from distrinews_lib.serving.schemas import Prediction, PredictRequest

COMMAND = ["-c", "from distrinews_course.bench.serving_litserve import main; main()"]  # after sys.executable


class DistriNewsLitAPI(ls.LitAPI):
    """Our checkpoint and classifier behind LitServe's LitAPI: decode one request, predict a batch, encode one."""

    def __init__(self, checkpoint: str, torch_threads: int, quantize: str = "none", **litapi):
        super().__init__(**litapi)
        self.checkpoint, self.torch_threads, self.quantize = checkpoint, torch_threads, quantize

    def setup(self, device):
        if self.torch_threads:
            torch.set_num_threads(self.torch_threads)
        self.classifier = Classifier(check_for_serving(self.checkpoint, "cpu", self.quantize), "cpu")

    def decode_request(self, request: PredictRequest):
        return request.text

    def predict(self, texts):
        return self.classifier.predict(list(texts))

    def encode_response(self, output) -> Prediction:
        return output


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description="Serve a DistriNews checkpoint with LitServe (the benchmark's competitor).")
    p.add_argument("--checkpoint", required=True)
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--max-batch-size", type=int, default=32)
    p.add_argument("--batch-timeout-ms", type=float, default=2.0)
    p.add_argument("--timeout-s", type=float, default=10.0, help="request timeout (ours: the deadline)")
    p.add_argument("--torch-threads", type=int, default=1)
    p.add_argument("--workers", type=int, default=1, help="inference workers (workers_per_device on the CPU)")
    p.add_argument("--quantize", default="none")
    args = p.parse_args(argv)
    api = DistriNewsLitAPI(
        args.checkpoint,
        args.torch_threads,
        args.quantize,
        max_batch_size=args.max_batch_size,
        batch_timeout=args.batch_timeout_ms / 1000,
    )
    server = ls.LitServer(api, accelerator="cpu", workers_per_device=args.workers, timeout=args.timeout_s)
    server.run(host="127.0.0.1", port=args.port, log_level="warning", generate_client_file=False)


if __name__ == "__main__":
    main()

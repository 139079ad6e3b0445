"""Serve a trained DistriNews checkpoint over HTTP (FastAPI + uvicorn), with micro-batching.

    python -m distrinews_lib.serving --checkpoint checkpoints/distilbert_agnews.pt
    uvicorn distrinews_lib.serving.app:app --port 8000

A start, in the order it runs: settings (ServingSettings), rebuild (the checkpoint's model and tokenizer), loading
(made ready: inference's answers checked, quantize's int8), app (create_app), lifespan (the batcher), protocol (the
HTTP limits). A request: middleware, routes, handlers (errors), schemas, batching, inference. Importing this package
loads nothing.
"""

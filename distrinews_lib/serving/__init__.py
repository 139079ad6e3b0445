"""Serve a trained DistriNews checkpoint over HTTP (FastAPI + uvicorn), with micro-batching.

    python -m distrinews_lib.serving --checkpoint checkpoints/distilbert_agnews.pt
    uvicorn distrinews_lib.serving.app:app --port 8000

app (create_app), settings (ServingSettings), lifespan, routes, handlers (errors), middleware, inference,
batching, protocol, schemas. Importing this package loads nothing.
"""

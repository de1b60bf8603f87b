"""OpenAI-compatible HTTP serving (FastAPI + uvicorn), imported only by `outpace serve`."""

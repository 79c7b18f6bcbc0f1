"""An OpenAI-compatible HTTP server for omnipipe pipelines (``omnipipe serve``)."""

from omnipipe.entrypoints.openai.app import create_app
from omnipipe.entrypoints.openai.engines import ServerConfig

__all__ = ["ServerConfig", "create_app"]

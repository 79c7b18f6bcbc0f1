"""An OpenAI-compatible HTTP server for omnipipe pipelines (``omnipipe serve``)."""

from omnipipe.server.app import create_app
from omnipipe.server.engines import ServerConfig

__all__ = ["ServerConfig", "create_app"]

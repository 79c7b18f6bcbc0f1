"""Topology in code (PipelineSpec), deployment in YAML (DeployConfig)."""

"""Engine proxy (AsyncOmniEngine) and the Orchestrator thread that drives the stages."""

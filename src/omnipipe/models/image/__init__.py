"""The image family: diffusion stages on diffusers; the digits model it trains itself."""

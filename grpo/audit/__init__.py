"""The reasoning-chain audit: four defect densities per 100 tokens on held-out problems."""

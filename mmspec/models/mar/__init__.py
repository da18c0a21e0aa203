"""MAR (continuous-token masked AR with a per-token diffusion head) and its KL autoencoder."""

from mmspec.models.mar.model import MAR_PRESETS, MARHead, MARModel
from mmspec.models.mar.vae import KLAutoencoder

__all__ = ["MAR_PRESETS", "KLAutoencoder", "MARHead", "MARModel"]

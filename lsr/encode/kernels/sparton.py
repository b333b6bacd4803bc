"""Re-exports ``sparton_head`` and ``torch_sparton_head`` under the path the design guide's public API names (the code lives in ``lsr.encode.sparton``)."""

from lsr.encode.sparton import sparton_head, torch_sparton_head

__all__ = ["sparton_head", "torch_sparton_head"]

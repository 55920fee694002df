"""spec-cli: exact speculative decoding for GGUF models on llama.cpp."""

from spec_cli.decoding.engine import Generation, TokenEvent
from spec_cli.decoding.sampling import SamplingParams
from spec_cli.decoding.stats import Stats
from spec_cli.errors import SpecError
from spec_cli.pair import Pair, load_pair
from spec_cli.request import GenerationRequest

__version__ = "0.1.0"

__all__ = ["Generation", "GenerationRequest", "Pair", "SamplingParams", "SpecError", "Stats", "TokenEvent",
           "load_pair"]

"""The HF tensor names of an MoE layer, per model family: Mixtral's `block_sparse_moe` with
experts w1/w3/w2, Qwen2/3-MoE's `mlp` with experts gate/up/down_proj and (Qwen2-MoE) a shared
expert and its gate. The checkpoint writer, the loader and the GGUF reader share them."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class MoeNames:
    """Names inside `model.layers.{i}.`."""

    block: str  # the MoE module
    projections: tuple[str, str, str]  # an expert's gate, up and down

    @property
    def router(self) -> str:
        return self.block + "gate.weight"

    def expert(self, e: int) -> tuple[str, str, str]:
        """Expert e's gate, up and down weights."""
        return tuple(f"{self.block}experts.{e}.{p}.weight" for p in self.projections)


MIXTRAL = MoeNames("block_sparse_moe.", ("w1", "w3", "w2"))
QWEN = MoeNames("mlp.", ("gate_proj", "up_proj", "down_proj"))
SHARED_EXPERT = tuple(f"mlp.shared_expert.{p}.weight" for p in QWEN.projections)
SHARED_EXPERT_GATE = "mlp.shared_expert_gate.weight"  # (1, hidden): one logit per token


def moe_names(model_type: str) -> MoeNames:
    return MIXTRAL if model_type == "mixtral" else QWEN

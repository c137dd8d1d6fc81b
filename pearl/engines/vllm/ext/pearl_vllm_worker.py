"""PEARL's vLLM worker extension (``--worker-extension-cls pearl_vllm_worker.PearlWeights``).

vLLM mixes this class into each of its workers; PEARL calls its methods through the server's
``/collective_rpc``. It runs inside vLLM's environment, which need not have PEARL installed, so
it imports nothing of PEARL: only the standard library, torch and safetensors (both come with
vLLM).
"""

from __future__ import annotations

import os


class PearlWeights:
    """Weights by version without a restart: load a published safetensors snapshot in place."""

    def pearl_load_weights(self, path: str) -> int:
        """Load every tensor of ``path`` (a ``.safetensors`` file, or a directory of them) into
        the running model (checkpoint names, as Hugging Face writes them); returns how many
        tensors were read."""
        from safetensors.torch import load_file

        files = (
            sorted(os.path.join(path, f) for f in os.listdir(path) if f.endswith(".safetensors"))
            if os.path.isdir(path)
            else [path]
        )
        if not files:
            raise ValueError(f"{path}: no .safetensors file to load")
        tensors: dict = {}
        for f in files:
            tensors.update(load_file(f))
        config = self.model_runner.model_config.hf_config  # type: ignore[attr-defined]
        embed = tensors.get("model.embed_tokens.weight")
        if getattr(config, "tie_word_embeddings", False) and embed is not None:
            # A tied checkpoint has no lm_head, and vLLM's reload does not tie it again: the
            # output layer would keep the old weights.
            tensors.setdefault("lm_head.weight", embed)
        # vLLM's in-place reload: checkpoint names in, and the layouts its kernels repacked the
        # weights into at start (oneDNN on CPUs, quantized kernels) are made again afterwards.
        self.model_runner.reload_weights(  # type: ignore[attr-defined]
            weights_iterator=iter(tensors.items()), is_checkpoint_format=True
        )
        return len(tensors)

"""Adapters for trainers other people wrote.

Each uses only PEARL's public surfaces: the embedding API (:mod:`pearl.runtime`: training
notifications, weight publishing, status) and the HTTP gateway (``/generate``), so that the same
adapter drives an embedded :class:`pearl.Runtime` and a running pearld.

- :mod:`pearl.integrations.generate`: a :data:`pearl.rl.rollout.GenerateFn` over the gateway's
  ``/generate``, for any agent loop that builds token-in, token-out trajectories;
- :mod:`pearl.integrations.trl`: TRL's ``GRPOTrainer`` (``rollout_func`` and a callback).
"""

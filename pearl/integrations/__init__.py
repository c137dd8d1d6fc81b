"""Adapters for trainers other people wrote.

Each uses only PEARL's public surfaces: the embedding API (:mod:`pearl.runtime`: training
notifications, weight publishing, status) and the HTTP gateway (``/generate``, chat
completions), so that the same adapter drives an embedded :class:`pearl.Runtime` and a running
pearld.

- :mod:`pearl.integrations.generate`: a :data:`pearl.rl.rollout.GenerateFn` over the gateway's
  ``/generate``, for any agent loop that builds token-in, token-out trajectories;
- :mod:`pearl.integrations.agent`: an agent function on the openai SDK as a trajectory's
  environment, its session recovered token for token from what the gateway served it;
- :mod:`pearl.integrations.trl`: TRL's ``GRPOTrainer`` (``rollout_func`` and a callback).
"""

"""PEARL's HTTP gateway: OpenAI- and SGLang-compatible endpoints in front of the elastic pool.

``backend`` is the contract (what the gateway needs from whatever generates), ``protocol`` the
validated request and response types, ``templates`` chat templates and tool-call parsing, ``app``
the FastAPI application, which wires ``routes`` (one module per API) over a ``context``; what the
routes share is ``jobs`` (a checked request), ``output`` (deltas to tokens and text), ``stops``,
``sse`` and ``errors``. ``guard`` is the middleware every request passes, ``pool`` the backend
over PEARL's Router, ``sessions`` the sessions measured as trajectories, ``serve`` the server
pearld and the Runtime run. With ``gateway.processes``, ``process`` is one gateway process (its
own Router, fed by pearld's routes ``feed``) and ``processes`` how pearld runs them. Importing
this package imports none of them.
"""

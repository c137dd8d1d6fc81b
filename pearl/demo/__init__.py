"""The demo application, ``pearl demo``: asynchronous agentic RL on an elastic pool, end to end.

An application of the library, not a part of it: it drives the embedded :class:`pearl.Runtime`
through its public methods, and nothing in ``pearl.core``, ``pearl.log``, ``actors`` or
``transports`` imports it. :mod:`.job` runs the job, :mod:`.app` holds its records, predictions
and report, :mod:`.learning` prepares the warm start and the held-out evaluation, :mod:`.report`
draws the plots and the summary table.
"""

from pearl.demo.app import StepRecord, Timeline, virtual_devices, write_report
from pearl.demo.job import run
from pearl.demo.learning import Learning
from pearl.demo.report import makespan_errors, summary_table

__all__ = [
    "Learning",
    "StepRecord",
    "Timeline",
    "makespan_errors",
    "run",
    "summary_table",
    "virtual_devices",
    "write_report",
]

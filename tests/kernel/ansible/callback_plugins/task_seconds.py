"""Prints each task's wall time after the recap (the tests keep the
transcripts): where the Ansible tests' minutes go under TCG."""

from __future__ import annotations

import time

from ansible.plugins.callback import CallbackBase

DOCUMENTATION = """
name: task_seconds
type: aggregate
short_description: wall time per task
description: prints each task's wall time at the end of the run
"""


class CallbackModule(CallbackBase):
    CALLBACK_VERSION = 2.0
    CALLBACK_TYPE = "aggregate"
    CALLBACK_NAME = "task_seconds"
    CALLBACK_NEEDS_ENABLED = True

    def __init__(self):
        super().__init__()
        self.times: list[tuple[str, float]] = []
        self.start = None
        self.name = ""

    def _close(self):
        if self.start is not None:
            self.times.append((self.name, time.monotonic() - self.start))
            self.start = None

    def v2_playbook_on_task_start(self, task, is_conditional):
        self._close()
        self.name, self.start = task.get_name(), time.monotonic()

    def v2_playbook_on_handler_task_start(self, task):
        self.v2_playbook_on_task_start(task, False)

    def v2_playbook_on_stats(self, stats):
        self._close()
        self._display.display("TASK SECONDS")
        for name, s in self.times:
            self._display.display(f"{s:7.1f} s  {name}")

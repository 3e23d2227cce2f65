"""The settings-preserving mode of the real-GPU suite, for GPUs the test does not own.

With ``--keep-gpu-settings`` every ``nvidia-smi -c MODE`` and ``nvidia-smi compute-policy
--set-timeslice=N`` the code under test runs through :class:`~kubeletplugin.runner.HostRunner`
is recorded instead of run, and a later ``--query-gpu=compute_mode`` of that GPU answers the mode
the code last asked for, so the code's own logic still runs end to end. Nothing else is
intercepted; MIG mode and GPU resets are never touched by the suite in either mode.

What this mode cannot prove: that the GPU accepted a compute mode or time-slice interval
(``test_time_slicing_interval_is_set_and_restored`` then checks the recorded commands instead of
the GPU's settings). The MPS tests need no setting: MPS runs in the GPU's own ``DEFAULT`` mode.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from kubeletplugin.runner import NVIDIA_SMI, CommandResult, HostRunner

#: ``--query-gpu=compute_mode`` spelling of each ``-c`` mode.
_PRINTED: Final = {
    "DEFAULT": "Default",
    "EXCLUSIVE_PROCESS": "Exclusive_Process",
    "EXCLUSIVE_THREAD": "Exclusive_Thread",
    "PROHIBITED": "Prohibited",
}


def changes_a_setting(args: Sequence[str]) -> bool:
    """Whether ``nvidia-smi ARGS`` would change a GPU setting this mode keeps."""
    return "-c" in args or any(a.startswith("--set-timeslice") for a in args)


@dataclass
class SettingsGuard:
    """Records setting changes instead of running them (see the module docstring)."""

    recorded: list[list[str]] = field(default_factory=list)
    asked_modes: dict[str, str] = field(default_factory=dict)

    def answer(self, args: Sequence[str]) -> CommandResult | None:
        """The recorded answer to ``nvidia-smi ARGS``, or None to run it for real."""
        argv = list(args)
        if changes_a_setting(argv):
            self.recorded.append(argv)
            if "-c" in argv and "-i" in argv:
                self.asked_modes[argv[argv.index("-i") + 1]] = argv[argv.index("-c") + 1]
            return CommandResult((NVIDIA_SMI, *argv), 0, "", "")
        if "--query-gpu=compute_mode" in argv and "-i" in argv:
            mode = self.asked_modes.get(argv[argv.index("-i") + 1])
            if mode is not None:
                return CommandResult((NVIDIA_SMI, *argv), 0, _PRINTED.get(mode, mode) + "\n", "")
        return None

    def install(self) -> Any:
        """Patch :meth:`HostRunner.run`; returns the original to put back."""
        original = HostRunner.run
        guard = self

        def run(
            runner: HostRunner, command: str, args: Sequence[str] = (), **kwargs: Any
        ) -> CommandResult:
            if command == NVIDIA_SMI:
                answer = guard.answer(args)
                if answer is not None:
                    return answer
            return original(runner, command, args, **kwargs)

        HostRunner.run = run  # type: ignore[method-assign,assignment]
        return original

    def summary(self) -> Mapping[str, Any]:
        return {"recordedSettingChanges": self.recorded}

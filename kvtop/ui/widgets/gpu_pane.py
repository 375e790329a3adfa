"""The GPU pane: what NVML says about each local GPU, beside the KV view."""

from __future__ import annotations

from rich.text import Text
from textual.widgets import Static

from kvtop.collect.nvml import GpuReading
from kvtop.safe_text import display_text
from kvtop.ui import format as fmt


class GpuPane(Static, can_focus=True):
    """Per GPU memory used/total, util, temperature, power and processes (vLLM marked)."""

    COMPONENT_CLASSES = {"gpu--title", "gpu--vllm", "gpu--dim", "gpu--bad"}  # noqa: RUF012
    _shown: Text | None = None

    def show_gpus(self, gpus: list[GpuReading]) -> None:
        title = self.get_component_rich_style("gpu--title")
        vllm = self.get_component_rich_style("gpu--vllm")
        dim = self.get_component_rich_style("gpu--dim")
        text = Text(no_wrap=True, overflow="ellipsis")
        for gpu in gpus:
            if text:
                text.append("\n")
            text.append(f"GPU{gpu.index} {display_text(gpu.name)}\n", title)
            used, total = gpu.memory_used_bytes, gpu.memory_total_bytes
            share = used / total if used is not None and total else None
            text.append(
                f" mem {fmt.bar(share, 8)} {fmt.bytes_gib(used)}/{fmt.bytes_gib(total)} GiB\n"
            )
            util = fmt.DASH if gpu.util_percent is None else f"{gpu.util_percent:.0f}%"
            temp = fmt.DASH if gpu.temperature_c is None else f"{gpu.temperature_c:.0f}°C"
            power = fmt.DASH if gpu.power_w is None else f"{gpu.power_w:.0f}W"
            text.append(f" util {util}  {temp}  {power}\n")
            if not gpu.processes:
                text.append(" no processes\n", dim)
            for proc in gpu.processes:
                mem = fmt.DASH if proc.used_bytes is None else f"{proc.used_bytes / 2**30:.1f}G"
                mark = "vLLM " if proc.is_vllm else ""
                text.append(f" {proc.pid:>7} {mem:>6} ")
                text.append(mark, vllm)
                # any local user names their own processes
                text.append(f"{display_text(proc.name)}\n", vllm if proc.is_vllm else "")
        if not gpus:
            text.append("no GPU found", dim)
        text.rstrip()
        self._set(text)

    def show_unavailable(self, reason: str) -> None:
        self._set(Text(f"NVML unavailable: {display_text(reason)}",
                       self.get_component_rich_style("gpu--bad")))

    def _set(self, text: Text) -> None:
        if text != self._shown:  # NVML reads every 2 s mostly repeat themselves
            self._shown = text
            self.update(text)

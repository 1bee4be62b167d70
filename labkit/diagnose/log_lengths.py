"""``--lengths log:PATH``: the lengths a run saw, from its log's metrics lines (verl prints ``prompt_length/mean``
and ``response_length/mean`` every step, ``verl/trainer/ppo/metric_utils.py: compute_data_metrics``), so the memory
verdict is priced at what the run met as well as at full width."""

from __future__ import annotations

from labkit.config.lengths import Uniform
from labkit.config.messages import ConfigError
from labkit.diagnose.command import read_log
from labkit.diagnose.log_lines import LogError, log_lines
from labkit.diagnose.log_metrics import last_metrics

PREFIX = "log:"
KEYS = ("prompt_length/mean", "response_length/mean")


def lengths_from_log(spec: str) -> Uniform:
    """``log:PATH`` -> every sample at the last step's mean prompt and response lengths (rounded up); ConfigError,
    one line, when the file cannot be read or no step line carries both means."""
    path = spec[len(PREFIX) :]
    try:
        metrics = last_metrics(log_lines(read_log(path)[0]))
    except (LogError, ConfigError) as exc:
        raise ConfigError(f"--lengths {spec}: {str(exc).removeprefix(path + ': ')}") from None
    missing = [k for k in KEYS if k not in metrics]
    if missing:
        where = f"its last step line (step {int(metrics['step'])})" if "step" in metrics else "no step:N line"
        raise ConfigError(
            f"--lengths {spec}: the log has no {' and no '.join(missing)} ({where}); verl prints both in every "
            "step's metrics line (step:N - ... response_length/mean:...); give the lengths as prompt=P,response=R"
        )
    prompt, response = (max(1, -int(-metrics[k] // 1)) for k in KEYS)
    step = int(metrics["step"]) if "step" in metrics else None
    return Uniform(prompt, response, source=f"the means of step {step} of {path}" if step else f"the means in {path}")

"""DeepSpeed 0.19's learning-rate schedules (deepspeed/runtime/lr_schedules.py: WarmupLR,
WarmupDecayLR, WarmupCosineLR) as its engine drives them: constructed at last_batch_iteration -1
(whose rate the engine's first steps run at), stepped after each applied optimizer step. Written
out here, independently of tz-train's C, for the checks that compare them step by step
(tests/test_deepspeed_compat.py, tools/torch_check.py)."""

import math


class Schedule:
    """One ds_config `scheduler` section (None: the optimizer's rate throughout). opt_lr is the
    optimizer's lr (WarmupLR's default peak, WarmupCosineLR's base); total_auto fills an absent
    total_num_steps; warmup_ratio > 0 sets the warm-up from the total as Hugging Face's Trainer
    fills warmup_num_steps "auto"."""

    TYPES = ("WarmupLR", "WarmupDecayLR", "WarmupCosineLR")

    def __init__(self, section, opt_lr, total_auto=None, warmup_ratio=0.0):
        self.type = section.get("type") if section else None
        p = dict(section.get("params", {})) if section else {}
        self.it = -1  # last_batch_iteration at construction
        self.opt_lr = opt_lr
        if self.type is None:
            return
        if self.type not in self.TYPES:
            raise ValueError("scheduler.type %s: not one of %s" % (self.type, ", ".join(self.TYPES)))
        self.total = p.get("total_num_steps", total_auto)
        w = p.get("warmup_num_steps", 1000)
        if warmup_ratio > 0:
            w = math.ceil(warmup_ratio * self.total)
        if not isinstance(w, int) or w <= 0:
            raise ValueError("warmup_num_steps must be a positive integer, got %r" % (w,))
        self.w = max(2, w)
        self.kind = p.get("warmup_type", "log")
        if self.kind not in ("log", "linear"):
            self.kind = "log"  # DeepSpeed warns and takes log
        self.inv_log = 1.0 / math.log(self.w)
        if self.type == "WarmupCosineLR":
            self.wmr = p.get("warmup_min_ratio", 0.0)
            self.cmr = p.get("cos_min_ratio", 0.0001)
        else:
            self.min = p.get("warmup_min_lr", 0.0)
            self.max = p.get("warmup_max_lr", opt_lr if self.type == "WarmupLR" else 0.001)
            self.delta = self.max - self.min

    def _warm(self):
        if self.kind == "log":
            return self.inv_log * math.log(self.it + 1)
        return self.it / self.w

    def lr(self):
        """The rate the next optimizer step runs at."""
        if self.type is None:
            return self.opt_lr
        if self.type == "WarmupCosineLR":
            if self.it < 0:
                return 0.0
            if self.it < self.w:
                ratio = self.wmr + self._warm() * (1.0 - self.wmr)
            else:
                prog = min(1.0, (self.it - self.w + 1) / max(1, self.total - self.w))
                ratio = (1 + math.cos(math.pi * prog)) / 2
                ratio = max(0.0, self.cmr + (1.0 - self.cmr) * ratio)
            return self.opt_lr * ratio
        if self.it < 0:
            return self.min
        if self.it < self.w:
            gamma = self._warm()
        elif self.type == "WarmupLR":
            gamma = 1.0
        else:
            gamma = max(0.0, float(self.total - self.it) / float(max(1.0, self.total - self.w)))
        return self.min + self.delta * gamma

    def step(self):
        self.it += 1

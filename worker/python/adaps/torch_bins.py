"""bin_schedule="auto": AdaComp's bins shrink while the residues hold updates taken at a
higher learning rate than the current one.

What a residue holds back is a worker's own updates of the last D steps, D being the
residue's delay: the unsent mass in units of one step's update. While the learning rate is
flat over those D steps, what is held back is the size of what is being sent, and the
declared bins are right. When it has fallen over them (a decay, a step down), the residues
carry steps of a larger rate into a model that now moves in smaller ones; smaller bins
deliver them sooner. So the rule compares the learning rate now with its mean over the
residue's delay:

    ratio = lr now / mean(lr over the last 3 D steps)   D measured, not assumed
    bins / 2 at ratio <= 3/4, / 4 at ratio <= 3/8       back up as the ratio recovers

D is the residues' mean age; their mass was gathered over about three of it (an element
waits until it stands out in its bin, some much longer than the mean), hence the window. It
depends on how fast the rate changes against the delay, not on the run's length or the
fraction of a peak: a cosine over 300 steps shrinks the bins from about its first half on
(the transformer's delay there is 10-30 steps), over 3,000 steps in its last tenth; a
constant rate (or the plateau of a warm-up-stable-decay schedule) never. D is measured on the declared bins
(the measured delay times the divisor in force), so that shrinking bins, which shorten the
delay, do not undo their own reason.

Nothing happens before the optimizer has taken 10 / (1 - beta1) steps (its first moment is
then about formed), and convolutions keep their bins (50, a tenth of the others').
"""
import collections

# The most the bins shrink, and the ratio at which the first halving comes; each further
# halving at half the ratio before it.
MAX_DIVISOR = 4
# The most a bin shrinks in all, with a fixed divisor (recompressed pulls' pushes) on top.
MAX_TOTAL_DIVISOR = 8
FIRST_RATIO = 0.75
# The window of learning rates the ratio's mean is taken over, in delays.
WINDOW_DELAYS = 3
# The delay is measured every this many steps (a pass over the residues and the updates)
# and smoothed over a few measurements.
MEASURE_EVERY = 10
_SMOOTHING = 0.3
# Learning rates kept: the longest delay the rule can see, in steps.
HISTORY = 4000


def divisor_for(ratio):
    """The bin divisor (1, 2 or 4) for lr now / its mean over the residues' delay."""
    divisor = 1
    while divisor < MAX_DIVISOR and ratio <= FIRST_RATIO / divisor:
        divisor *= 2
    return divisor


class BinSchedule:
    """The learning rates of the last steps and the residues' measured delay; `update`
    says the divisor of every non-convolution AdaComp bin after each optimizer step."""

    def __init__(self, start_step):
        self.start_step = start_step  # the optimizer's step from which bins may shrink
        self.rates = collections.deque(maxlen=HISTORY)
        self.delay = None  # steps, on the declared bins; None until first measured
        self.divisor = 1
        self.fixed_divisor = 1  # the bins' own divisor before the schedule's (1: declared)

    def wants_measure(self, steps):
        """Whether the caller should measure the residues and updates at this step."""
        return steps % MEASURE_EVERY == 0 or self.delay is None

    def measured(self, residue_mass, update_mass, steps_covered=1):
        """One measurement: sum |residue| and sum |update| over the AdaComp tensors, the
        update covering steps_covered optimizer steps (local steps: the steps since the last
        exchange)."""
        if update_mass <= 0 or residue_mass < 0:
            return  # no update this step (a zero rate, no gradient): nothing to learn
        d = residue_mass * steps_covered / update_mass * \
            min(MAX_TOTAL_DIVISOR, self.divisor * self.fixed_divisor)
        d = min(float(HISTORY), max(1.0, d))
        self.delay = d if self.delay is None else \
            (1 - _SMOOTHING) * self.delay + _SMOOTHING * d

    def update(self, lr, steps):
        """Records this step's learning rate; returns the divisor now in force."""
        past = list(self.rates)
        self.rates.append(float(lr))
        if steps < self.start_step or self.delay is None or not past:
            self.divisor = 1
            return self.divisor
        window = past[-max(1, int(round(WINDOW_DELAYS * self.delay))):]
        mean = sum(window) / len(window)
        self.divisor = divisor_for(lr / mean) if mean > 0 else 1
        return self.divisor

    def state_dict(self):
        """The rates and the delay; the divisor is not state: it is what the worker's bins
        are now, and a resumed run sets them at its first step."""
        return {"rates": list(self.rates), "delay": self.delay}

    def load_state_dict(self, state):
        """Checked before anything changes: a bad state raises ValueError."""
        try:
            rates = [float(r) for r in state["rates"]]
            delay = None if state["delay"] is None else float(state["delay"])
        except (KeyError, TypeError, ValueError) as err:
            raise ValueError("adaps.torch: the checkpoint's bin schedule is not the rates "
                             "and delay that state_dict() writes (%r)" % (err,)) from None
        self.rates = collections.deque(rates, maxlen=HISTORY)
        self.delay = delay

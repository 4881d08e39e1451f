"""A live progress line per epoch for training scripts (rank 0 only).

    progress = adaps.progress.Progress(steps_per_epoch, epoch=e, epochs=n, rank=worker.rank,
                                       batch_size=64)
    for b in range(steps_per_epoch):
        ...
        progress.update(b + 1, loss=loss.item(), compression=opt_compression)
    progress.close()

Shows steps done/total, ETA, the epoch's mean loss so far, throughput (images/s when
batch_size is given, else steps/s) and the compression (dense / wire bytes pushed).

On a terminal (the stream is a tty, or ADAPS_PROGRESS=tty, which adaps.launch sets for
its workers when its own output is a terminal) one line is rewritten in place with "\\r"
at most every `min_interval` seconds and ended by close(). Otherwise (a log) a plain line
is printed each time another `log_percent` of the epoch is done; close() prints nothing,
the script's own per-epoch line follows. Ranks other than 0 print nothing. Use write()
for other messages during an epoch: it clears the line first.
"""
import os
import sys
import time


class Progress:
    def __init__(self, steps, epoch=0, epochs=1, rank=0, batch_size=None, stream=None,
                 terminal=None, min_interval=0.25, log_percent=10, clock=time.monotonic):
        self.steps = max(int(steps), 1)
        self.epoch, self.epochs = epoch, epochs
        self.batch_size = batch_size
        self.stream = stream if stream is not None else sys.stdout
        if terminal is None:
            isatty = getattr(self.stream, "isatty", None)
            terminal = bool(isatty and isatty()) or os.environ.get("ADAPS_PROGRESS") == "tty"
        self.terminal = terminal
        self.enabled = rank == 0
        self.min_interval = min_interval
        self.log_percent = min(max(int(log_percent), 1), 100)
        self._clock = clock
        self._start = clock()
        self._last_shown = None
        self._bucket = 0
        self._loss_sum, self._losses = 0.0, 0
        self._done, self._compression = 0, None

    def format(self, now=None):
        """The text of the line (no "\\r", no newline)."""
        now = self._clock() if now is None else now
        elapsed = max(now - self._start, 0.0)
        done = self._done
        eta = elapsed / done * (self.steps - done) if done else 0.0
        rate = done / elapsed if elapsed > 0 else 0.0
        mins, secs = divmod(int(eta + 0.5), 60)
        text = "epoch %d/%d  step %d/%d (%3d%%)  ETA %d:%02d" % (
            self.epoch + 1, self.epochs, done, self.steps, done * 100 // self.steps, mins, secs)
        if self._losses:
            text += "  loss %.4f" % (self._loss_sum / self._losses)
        if self.batch_size:
            text += "  %.0f img/s" % (rate * self.batch_size)
        else:
            text += "  %.1f steps/s" % rate
        compression = self._compression() if callable(self._compression) else self._compression
        if compression:
            text += "  compression %.1fx" % compression
        return text

    def update(self, done, loss=None, compression=None):
        """Records `done` steps of the epoch (and this step's loss); prints when due.
        `compression` may be a function, called only when a line is printed."""
        self._done = done
        if loss is not None:
            self._loss_sum += float(loss)
            self._losses += 1
        if compression is not None:
            self._compression = compression
        if not self.enabled:
            return
        now = self._clock()
        if self.terminal:
            if self._last_shown is None or now - self._last_shown >= self.min_interval:
                self._draw(now)
            return
        bucket = done * 100 // self.steps // self.log_percent
        if bucket > self._bucket and done < self.steps:
            self._bucket = bucket
            self.stream.write(self.format(now) + "\n")
            self.stream.flush()

    def write(self, message):
        """Prints `message` on its own line (clearing the progress line on a terminal)."""
        if self.enabled and self.terminal:
            self.stream.write("\r\x1b[K")
            self._last_shown = None
        self.stream.write(message + "\n")
        self.stream.flush()

    def close(self, compression=None):
        """Ends the epoch's line (terminal: its final state and a newline)."""
        if compression is not None:
            self._compression = compression
        if self.enabled and self.terminal:
            self._draw(self._clock())
            self.stream.write("\n")
            self.stream.flush()

    def _draw(self, now):
        self.stream.write("\r" + self.format(now) + "\x1b[K")
        self.stream.flush()
        self._last_shown = now

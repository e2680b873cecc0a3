"""A consumer's view of its group being refused by the brokers (the group's config turns
consuming off: ConsumeDisabledError) as episodes, from the first refused pull to the first pull
served after it, and the pace of its pulls meanwhile: one probe for the whole consumer per
back-off period (doubling up to MAX_PROBE_S), not one pull per queue per second.
Pure: time comes in as monotonic seconds; never pulls, sleeps, logs or calls the application.
"""

from __future__ import annotations

from raftmq.common.errors import ConsumeDisabledError

FIRST_PROBE_S = 0.5  # the first probe after a refusal; each refused probe doubles the wait
MAX_PROBE_S = 5.0  # an admin's `--consume on` is noticed within this (plus one pull)
# A queue waiting for the probe looks again this often: the others follow a served probe soon
# after, without a wake-up from it.
RECHECK_S = 0.25


class GroupRefusal:
    """One consumer's state; `error` is the episode's refusal, None while the group consumes."""

    def __init__(self, first_probe_s: float = FIRST_PROBE_S, max_probe_s: float = MAX_PROBE_S):
        assert 0 < first_probe_s <= max_probe_s
        self._first_s = first_probe_s
        self._max_s = max_probe_s
        self.error: ConsumeDisabledError | None = None
        self._since_s = 0.0  # when the episode's first refused pull was sent
        self._interval_s = 0.0
        self._next_probe_s = 0.0
        self._probe_sent_s = 0.0  # the last probe's (or the episode's closing) time

    def pull_delay_s(self, now_s: float) -> float:
        """0: pull now (in an episode, this pull is the probe); else ask again after this."""
        if self.error is None:
            return 0.0
        if now_s < self._next_probe_s:
            return min(self._next_probe_s - now_s, RECHECK_S)
        self._probe_sent_s = now_s
        # The next probe even if this one's answer is lost (a timeout is neither refused nor
        # served): the pace holds whatever happens to the probe.
        self._next_probe_s = now_s + self._interval_s
        return 0.0

    def refused(self, error: ConsumeDisabledError, sent_s: float, now_s: float) -> bool:
        """A pull sent at `sent_s` was refused; True when this starts an episode (whose error
        stays the first one: the application was told of that one)."""
        if self.error is None:
            self.error, self._since_s = error, sent_s
            self._interval_s = self._first_s
            self._next_probe_s = now_s + self._interval_s
            self._probe_sent_s = now_s  # pulls sent before now were not paced: stragglers
            return True
        if sent_s >= self._probe_sent_s:
            # The probe was refused (not a pull already on its way when the episode began).
            self._interval_s = min(self._interval_s * 2, self._max_s)
            self._next_probe_s = now_s + self._interval_s
        return False

    def served(self, sent_s: float) -> ConsumeDisabledError | None:
        """A pull sent at `sent_s` was served: the episode ends if the pull came after its
        start (one that was held since before it says nothing), and its error is returned."""
        if self.error is None or sent_s < self._since_s:
            return None
        ended, self.error = self.error, None
        return ended

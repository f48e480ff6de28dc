"""The adaptive controller's decision rule: the batch of the highest goodput, on the run's own
noise scale once trustworthy (on a prior before), changed only when the gain exceeds the error,
and after the first decision on the run's own noise scale only upwards (unless ``shrink``).

``GoodputChoice`` is mixed into :class:`~nnabla_torus.planning.controller.BatchSizeController`:
it decides on the state the controller keeps (``current``, ``candidates``, ``decisions``,
``measured``, ``prior_overridden``, ...) and hands the plans it picks to the controller's
``_set`` and its notes to ``_note``, which log them. Its parts: phi to decide with (``_phi``:
the run's own, before it the prior's), the first decision's bound on phi's error and its price
(``_max_rse``, ``_waits``), every candidate's throughput (``_throughput``: the cost model's,
then the refit's) and the learning rate at a batch (``_adaptive_lr_factor``);
docs/adaptive-batch.md gives the rules and why.
"""
import math

import numpy as np

from . import efficiency_fit, goodput, step_refit
from .batch_candidates import one_split_per_batch

PRICED_MAX_RSE = 1.0                 # MAX_RSE for the first decision of a run of known length,
                                     # which goodput.waiting prices instead (at 1 phi's band
                                     # reaches 0 and no batch above B0 can be chosen)


class GoodputChoice:
    """The adaptive mode of BatchSizeController (a mixin); see module doc."""

    def _plan_adaptive(self, epoch):
        est = self.noise_scale
        conf = goodput.confidence(est.updates, est.rse, self.min_samples, self._max_rse())
        fresh = self.current is None
        if fresh:
            start = self._set(epoch, self.min_batch, self._start_reason(),
                              factor=self.lr_factor(self.min_batch))
        elif self.current.global_batch not in self.candidates["global_batch"]:
            return self._move_inside_bounds(epoch)
        phi = self._phi(epoch, conf)
        if phi is None:
            return start if fresh else self._refresh_lr()
        phi, rse, measured_phi = phi
        speed = self._throughput()
        if speed is None:            # measured before: wait for the batch in use to be measured
            return self._refresh_lr(changed=fresh)
        speed, model_error, source, measured = speed
        rows = one_split_per_batch(self.candidates, self.current, speed, model_error)
        batches, speed, model_error = (self.candidates["global_batch"][rows], speed[rows],
                                       model_error[rows])
        local, accum = self.candidates["local_batch"][rows], self.candidates["accum_steps"][rows]
        now = int(np.argmin(np.abs(batches - self.current.global_batch)))
        if measured_phi and self.decisions == 0 and self.refit is not None and not measured:
            return self._refresh_lr(changed=fresh)   # the first measured decision: on
            #                                          measured step times too (step 7)
        if measured_phi and self.decisions == 0 and self.run_images and self._waits(
                epoch, batches, speed, phi, rse, now, conf.samples):
            return self._refresh_lr(changed=fresh)
        switched = measured and not self.measured
        self.measured = self.measured or measured
        d = goodput.decide(batches, speed, phi, rse, self.min_batch, now, model_error)
        best_batch = int(batches[d.best])
        where = (f"{conf.samples} samples" if measured_phi else
                 f"the prior at {self._fraction(epoch):.0%} of training, {self.prior.kind}")
        if self.efficiency is not None:
            where += f"; {self.efficiency.factor:.2f} x B_simple, fitted"
        numbers = (f"phi = {phi:.0f} +- {rse:.0%} ({where}); batch "
                   f"{int(batches[now])} ({local[now]} x {accum[now]}) -> {best_batch} "
                   f"({local[d.best]} x {accum[d.best]}): throughput "
                   f"{speed[now]:.0f} -> {speed[d.best]:.0f} "
                   f"samples/s x efficiency "
                   f"{float(goodput.efficiency(batches[now], phi, self.min_batch)):.3f} -> "
                   f"{float(goodput.efficiency(best_batch, phi, self.min_batch)):.3f} = "
                   f"goodput {d.goodput[now]:.0f} -> {d.goodput[d.best]:.0f} ({d.gain:.3f}x) "
                   f"against a prediction error of {d.threshold:.1%}; throughput from {source}")
        self.decisions += 1
        grows_only = self.own_decisions > 0 and not self.shrink   # after the first own decision
        self.own_decisions += measured_phi
        if d.change and best_batch < int(batches[now]) and grows_only:
            self._hold(epoch, f"goodput: keep: the batch only grows after the first decision on "
                              f"the run's own noise scale (--adaptive-shrink lets it fall), "
                              f"{numbers}")
            return self._refresh_lr(changed=fresh)
        if d.change:
            self._held.clear()
            return self._set(epoch, best_batch, "goodput: change, " + numbers,
                             factor=self._adaptive_lr_factor(best_batch),
                             split=(int(local[d.best]), int(accum[d.best])))
        verdict = ("keep: the best batch is the one in use" if d.best == now else
                   "keep: the gain is inside the prediction error")
        self._hold(epoch, f"goodput: {verdict}, {numbers}",
                   always=self.decisions == 1 or switched, quiet=d.best == now)
        return self._refresh_lr(changed=fresh)

    def _hold(self, epoch, text, always=False, quiet=False):
        """Note a decision that keeps the batch: always when ``always``, else once per epoch
        unless ``quiet``."""
        if always or (not quiet and math.floor(epoch) not in self._held):
            self._held.add(math.floor(epoch))
            self._note(epoch, text)

    def _adaptive_lr_factor(self, global_batch):
        """lr_factor(B0) x gain(B): the rate at B0, raised by the goodput model's gain (or
        ``adaptive_lr="scaling"``: lr_factor(B), the fixed policies' rule)."""
        if self.lr_at_change == "keep":
            return self.lr_factor(self.min_batch)
        if self.adaptive_lr == "scaling":
            return self.lr_factor(global_batch)
        phi = self.noise_scale.b_simple
        if phi is not None:
            phi = efficiency_fit.apply(self.efficiency, phi, 0.0)[0]
        return self.lr_factor(self.min_batch) * float(goodput.gain(global_batch, phi,
                                                                   self.min_batch))

    def _max_rse(self):
        """The confidence rule's bound on phi's error: ``max_rse``, but at least
        ``PRICED_MAX_RSE`` for the first decision of a run whose length is known: there
        ``goodput.waiting`` weighs phi's error against the run's length (a 55-step run does not
        wait for the error a 3,000-step run waits for; measured before this rule: 31 of 55
        steps at B0 while the error stayed above 0.5)."""
        priced = self.decisions == 0 and self.run_images     # no prior decided before it
        return max(self.max_rse, PRICED_MAX_RSE) if priced else self.max_rse

    def _start_reason(self):
        if self.prior is not None:
            starts = (f" from {self.prior.starts:.1%} of training (before it the earlier run "
                      f"measured at B0)" if self.prior.starts > 0 else "")
            return (f"goodput: start at B0 = {self.min_batch}, then decide on the prior "
                    f"({self.prior.kind}: {self.prior.where}){starts} until the run's own "
                    f"noise scale is trustworthy")
        if self.run_images:
            trust = (f">= {self.min_samples} samples, relative error <= {PRICED_MAX_RSE:g}, and "
                     f"waiting costs more than a wrong move risks over the run's "
                     f"{self.run_images:,.0f} images")
        else:
            trust = f">= {self.min_samples} samples, relative error <= {self.max_rse:g}"
        return (f"goodput: start at B0 = {self.min_batch} until the noise scale is trustworthy "
                f"({trust})")

    def _fraction(self, epoch):
        """Fraction of the run done at ``epoch`` (0 when the run's length is not known)."""
        return min(1.0, epoch / self.epochs) if self.epochs else 0.0

    def _phi(self, epoch, conf):
        """(phi, rse, measured) to decide with, or None (no decision now): the run's own
        estimate once trustworthy, before that the prior's at this fraction of training (none
        before the prior starts); with ``efficiency`` (a fitted factor, efficiency_fit.py)
        times its factor, its error added."""
        fraction = self._fraction(epoch)
        if conf.ok:
            if self.prior is not None and not self.prior_overridden:
                self.prior_overridden = True
                if fraction < self.prior.starts:
                    against = (f"before the prior starts ({self.prior.starts:.1%} of "
                               f"training, {self.prior.kind})")
                else:
                    prior_phi, prior_rse = (float(v) for v in self.prior.phi_at(fraction))
                    against = (f"against the prior's {prior_phi:.0f} +- {prior_rse:.0%} "
                               f"({self.prior.kind})")
                self._note(epoch, f"goodput: the measurement overrides the prior from now on: "
                                  f"phi = {self.noise_scale.b_simple:.0f} +- {conf.rse:.0%} "
                                  f"({conf.samples} samples) {against}")
            return (*efficiency_fit.apply(self.efficiency, self.noise_scale.b_simple,
                                          conf.rse), True)
        if (self.prior is not None and not self.prior_overridden and
                fraction >= self.prior.starts):
            phi, rse = (float(v) for v in self.prior.phi_at(fraction))
            return (*efficiency_fit.apply(self.efficiency, phi, rse), False)
        return None

    def _waits(self, epoch, batches, speed, phi, rse, now, samples):
        """The first decision's price (goodput.waiting): True while measuring pays; its
        numbers are noted once, when it stops waiting."""
        left = self.run_images * (1.0 - self._fraction(epoch))
        w = goodput.waiting(batches, speed, phi, rse, self.min_batch, now, samples, left)
        if not w.pays:
            self._note(epoch, f"goodput: first decision after {samples} samples: measuring "
                              f"has cost {w.waited_s:.1f} s, a decision now risks "
                              f"{w.risk_s:.1f} s over the {left:,.0f} images left "
                              f"(expected regret {w.regret:.2%} at phi = {phi:.0f} +- {rse:.0%})")
        return w.pays

    def _move_inside_bounds(self, epoch):
        """The plan in use (a resumed checkpoint's, or another world's) is no batch of
        [min_batch, max_batch]: train at the nearest that is, now."""
        batches = self.candidates["global_batch"]
        old = self.current.global_batch
        nearest = int(batches[np.argmin(np.abs(batches - old))])
        return self._set(epoch, nearest, f"goodput: the batch in use {old} is outside "
                         f"[{self.min_batch}, {self.max_batch}] (min_batch, max_batch): moved "
                         f"to {nearest}", factor=self._adaptive_lr_factor(nearest))

    def _throughput(self):
        """(throughput of every candidate, its model error, its source, whether measured) for a
        decision now.

        The cost model's column until the refit has ``min_steps`` measured steps at the batch in
        use; from then on the refit's, with its residual error at the per-rank batches it has
        measured and at least the cost model's error at the others (an extrapolation to a
        micro-batch never run: the residual only measures the fit where it has data; measured
        on a quiet machine, the 2-5 % residual at 64 let a 1.06x prediction for 108 move the
        batch, and it did not pay). Accumulation repeats a measured micro-batch: on the
        emulated cluster the steps of 16 x 3, 16 x 6 and 32 x 2 came within 5 % of the refit
        from 16 x 1 and 32 x 1 (docs/adaptive-batch.md, "Throughput refit"). Once a decision
        has used the refit, None (no decision) while the batch in use is not yet measured (after
        a change). The model error is one per candidate.
        """
        cand, refit, plan = self.candidates, self.refit, self.current
        if refit is None or not refit.ready(plan.local_batch, plan.accum_steps):
            if self.measured:
                return None
            return (cand["throughput"], np.full(len(cand["throughput"]), self.model_error),
                    f"the cost model (error {self.model_error:.1%})", False)
        fit = refit.fit()
        measured = np.isin(cand["local_batch"], [m for m, _ in fit.counted])
        error = np.where(measured, fit.error, max(fit.error, self.model_error))
        return (step_refit.throughput(fit, cand["local_batch"], cand["accum_steps"]),
                error, "measured step times: " + step_refit.describe(fit), True)

    def _refresh_lr(self, changed=False):
        """The current plan with the LR factor for the latest phi."""
        factor = self._adaptive_lr_factor(self.current.global_batch)
        self.current = self.current._replace(changed=changed, lr_factor=factor)
        return self.current

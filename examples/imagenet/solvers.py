"""The example's optimizer: nnabla solvers with weight decay only where it belongs.

Example::

    solvers = SolverGroup(cfg, nn.get_parameters())
    solvers.set_learning_rate(0.1)
    solvers.zero_grad(); loss.backward(); solvers.weight_decay(1e-4); solvers.update()
"""
import nnabla.solvers as S

from nnabla_torus.training.adaptive import scale_momentum
from nnabla_torus.training.state import get_solver_arrays, load_solver_arrays

from models import is_bn_or_bias


class SolverGroup:
    """Two nnabla solvers as one: weight decay (and LARS) only for conv/affine weights.

    BN parameters and biases get plain momentum and no decay (Jia et al. 2018) unless
    ``cfg.no_decay_bn_bias`` is off (then every parameter is in the first). Duck-types
    the solver methods that DynamicLossScaling and the loop call.
    """

    def __init__(self, cfg, params):
        exempt = is_bn_or_bias if cfg.no_decay_bn_bias else (lambda name: False)
        decayed = {k: v for k, v in params.items() if not exempt(k)}
        plain = {k: v for k, v in params.items() if exempt(k)}
        main = S.Lars(cfg.base_lr, cfg.momentum, cfg.lars_coefficient) \
            if cfg.optimizer == "lars" else S.Momentum(cfg.base_lr, cfg.momentum)
        main.set_parameters(decayed)
        other = S.Momentum(cfg.base_lr, cfg.momentum)
        other.set_parameters(plain)
        self.solvers = {"decayed": main, "plain": other}

    def _each(self, method, *args):
        for solver in self.solvers.values():
            getattr(solver, method)(*args)

    def set_learning_rate(self, lr):
        self._each("set_learning_rate", lr)

    def zero_grad(self):
        self._each("zero_grad")

    def scale_grad(self, scale):
        self._each("scale_grad", scale)

    def update(self):
        self._each("update")

    def scale_momentum(self, factor):
        """Multiply the momentum buffers by ``factor`` (controller.momentum_scale at a batch
        change). Each solver's only state is its velocity (Momentum ``m``, LARS ``v``), which
        nnabla keeps with the learning rate inside (v <- m v + lr g)."""
        scale_momentum(self.solvers.values(), factor)

    def weight_decay(self, rate):
        self.solvers["decayed"].weight_decay(rate)

    def check_inf_or_nan_grad(self):
        return any(s.check_inf_or_nan_grad() for s in self.solvers.values())

    def state_arrays(self):
        """Solver states as (name -> ndarray, name -> step count t)."""
        return get_solver_arrays(self.solvers)

    def load_state_arrays(self, arrays, steps):
        load_solver_arrays(self.solvers, arrays, steps)

"""A Keras model as a list of steps in topological order, and the stage sub-models cut from it.

A step is one call of one layer (a node of the functional graph; for a Sequential model, its
layers in order). The tensors live across the cut after step k are those made at or before
k (or the model's inputs) and still needed after it (by a later step, or as a model output),
so a skip connection that crosses a cut is carried by it. A `StageModel` runs steps
[start, end): it takes the live tensors of the cut before it and returns those of the cut
after it. Subclassed models have no graph to cut and are refused.
"""

from __future__ import annotations

from dataclasses import dataclass

from nbdist.errors import ConfigError


@dataclass
class Step:
    """One layer call: the operation, and how its arguments fill in from computed tensors."""

    op: object
    node: object | None  # the functional node; None for a Sequential layer
    inputs: list[int]  # ids of the tensors it reads
    outputs: list[int]  # ids of the tensors it makes

    @property
    def name(self) -> str:
        return self.op.name


class Graph:
    """The steps of `model` and which tensors each cut carries."""

    def __init__(self, model):
        self.model = model
        self.steps, self.inputs, self.outputs = _steps(model)
        self.made_at = {t: -1 for t in self.inputs}
        last_use: dict[int, int] = {}
        for k, step in enumerate(self.steps):
            for t in step.outputs:
                self.made_at[t] = k
            for t in step.inputs:
                last_use[t] = k
        for t in self.outputs:
            last_use[t] = len(self.steps)
        self.last_use = last_use

    @property
    def names(self) -> list[str]:
        return [s.name for s in self.steps]

    def live(self, cut: int) -> list[int]:
        """Ids of the tensors live across the cut after step `cut` (-1: the model's inputs), in
        the order they were made."""
        if cut < 0:
            return list(self.inputs)
        if cut >= len(self.steps) - 1:
            return list(self.outputs)
        return sorted((t for t, k in self.made_at.items() if k <= cut < self.last_use.get(t, -1)),
                      key=lambda t: (self.made_at[t], t))

    def places(self, bounds) -> bool:
        """Whether `bounds` keeps each layer's calls in one stage (`check_bounds` refuses it
        otherwise)."""
        try:
            self.check_bounds(bounds)
        except ConfigError:
            return False
        return True

    def check_bounds(self, bounds) -> None:
        """Refuse a cut that splits one layer's calls (a shared layer) across stages."""
        stage_of: dict[int, int] = {}
        for s, (start, end) in enumerate(bounds):
            for step in self.steps[start:end]:
                other = stage_of.setdefault(id(step.op), s)
                if other != s:
                    raise ConfigError(
                        f"The layer {step.name!r} is called in stage {other} and in stage {s}: its "
                        "weights would live on two engines at once, which pipeline mode does not "
                        "support. Use fewer --stages, another --partition, or give each call its "
                        "own layer.")

    def stage_ops(self, start: int, end: int) -> list:
        """Each operation of steps [start, end) once, in order."""
        seen, ops = set(), []
        for step in self.steps[start:end]:
            if id(step.op) not in seen:
                seen.add(id(step.op))
                ops.append(step.op)
        return ops

    def variables(self, start: int, end: int) -> dict[int, list]:
        """The variables of steps [start, end), by the step that first calls each layer (the
        same cell builds the same graph on every engine and in the kernel)."""
        first = self._first_steps()
        return {first[id(op)]: op_weights(op) for op in self.stage_ops(start, end)}

    def weights(self, start: int, end: int) -> dict[int, list]:
        """The values of `variables(start, end)`."""
        return {k: [v.numpy() for v in variables]
                for k, variables in self.variables(start, end).items()}

    def step_variables(self, steps: list[int]) -> list:
        """The variables of the layers first called at `steps`, in that order: where a stage's
        `weights` are (its `messages.Weights`), in this graph."""
        return [v for k in steps for v in op_weights(self.steps[int(k)].op)]

    def assign(self, values: dict[int, list]) -> None:
        """Write `weights(...)` results (from every stage) into this graph's layers."""
        for k, arrays in values.items():
            for variable, value in zip(op_weights(self.steps[int(k)].op), arrays, strict=True):
                variable.assign(value)

    def _first_steps(self) -> dict[int, int]:
        first: dict[int, int] = {}
        for k, step in enumerate(self.steps):
            first.setdefault(id(step.op), k)
        return first


def op_weights(op) -> list:
    """The variables of a step's operation: a layer's weights, none for an operator between
    layers (`x + y`, `x * 0.5`: a keras.ops operation, which is no layer and has no weights)."""
    return list(getattr(op, "weights", ()))


def _steps(model) -> tuple[list[Step], list[int], list[int]]:
    import keras  # Keras: after the cell picks its backend

    functional = (getattr(model, "_functional", None) if isinstance(model, keras.Sequential)
                  else model)
    if isinstance(model, keras.Sequential) and functional is None:
        layers = list(model.layers)  # no input shape known: a plain chain
        steps = [Step(layer, None, [i], [i + 1]) for i, layer in enumerate(layers)]
        return steps, [0], [len(layers)]
    if not hasattr(functional, "_nodes_by_depth") or not hasattr(functional, "inputs"):
        raise ConfigError(
            f"--mode pipeline cuts a model's graph of layers into stages, but "
            f"{type(model).__name__} is a subclassed keras.Model: its call() is Python code with "
            "no graph to cut. Write the model as keras.Sequential([...]) or with the functional "
            "API (keras.Input, then layers called on tensors), or use --mode async or sync, which "
            "train any model.")
    steps = []
    for depth in sorted(functional._nodes_by_depth, reverse=True):  # noqa: SLF001 - Keras's own order
        for node in functional._nodes_by_depth[depth]:  # noqa: SLF001
            if not node.operation or node.is_input:
                continue
            steps.append(Step(node.operation, node, [id(x) for x in node.input_tensors],
                              [id(x) for x in node.outputs]))
    return steps, [id(x) for x in functional.inputs], [id(x) for x in functional.outputs]


def call_step(step: Step, values: dict, training: bool):
    """Run one step on computed tensors (`values`: tensor id -> value), recording its outputs."""
    from keras import tree  # Keras: after the cell picks its backend

    if step.node is None:
        args, kwargs = (values[step.inputs[0]],), {}
    else:
        args, kwargs = step.node.arguments.fill_in(values)
    if ("training" in getattr(step.op, "_call_context_args", ())
            or getattr(step.op, "_call_has_training_arg", False)):
        kwargs["training"] = training
    out = step.op(*args, **kwargs)
    for t, v in zip(step.outputs, tree.flatten(out), strict=True):
        values[t] = v


class StageModel:
    """Steps [start, end) of a graph: the live tensors of the cut before in, those after out."""

    def __init__(self, graph: Graph, start: int, end: int):
        self.graph, self.start, self.end = graph, start, end
        self.in_ids, self.out_ids = graph.live(start - 1), graph.live(end - 1)
        self.ops = graph.stage_ops(start, end)
        self.trainable = [v for op in self.ops for v in getattr(op, "trainable_variables", [])]

    def forward(self, inputs: list, training: bool = True) -> list:
        from keras import ops  # Keras: after the cell picks its backend

        values = dict(zip(self.in_ids, inputs, strict=True))
        for step in self.graph.steps[self.start:self.end]:
            call_step(step, values, training)
        # a tensor only passing through is still an output of this stage's own (for its gradient)
        return [ops.copy(values[t]) if t in self.in_ids else values[t] for t in self.out_ids]

    def regularization(self):
        """The weight (and activity) penalties of this stage's layers, summed (0 without)."""
        losses = [loss for op in self.ops for loss in getattr(op, "losses", [])]
        return sum(losses) if losses else 0.0

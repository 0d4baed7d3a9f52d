"""The IR: construction through use-def links, printer, verify(), topo_sort, extract."""

import numpy as np
import pytest

from autoclust.ir import Graph, Node, Value


def small_graph():
    """x -> Relu -> a; a, w -> Add -> b; b -> Exp -> y (graph output)."""
    g = Graph("small")
    x = g.add_input("x", np.float32, ("batch", 3))
    w = g.add_initializer("w", np.ones(3, np.float32))
    relu = g.make_node("Relu", [x], name="relu")
    add = g.make_node("Add", [relu.outputs[0], w], name="add")
    exp = g.make_node("Exp", [add.outputs[0]], name="exp")
    g.outputs = [exp.outputs[0]]
    return g, relu, add, exp


def test_use_def_links_and_printer():
    g, relu, add, exp = small_graph()
    a = relu.outputs[0]
    assert a.producer is relu and g.consumers(a) == [add]
    assert g.is_constant(g.values["w"]) and g.constant_value(g.values["x"]) is None
    g.values["x"].shape = ("batch", 3)
    relu.outputs[0].dtype, relu.outputs[0].shape = np.dtype(np.float32), ("batch", 3)
    text = str(g)
    assert text.splitlines()[0] == "graph small ("
    assert "%x:float32[batch,3]," in text
    assert "%w = constant float32[3][1.0, 1.0, 1.0]" in text
    assert "= Relu(%x)  # relu" in text
    assert text.rstrip().endswith(f"return %{exp.outputs[0].name}\n}}".rstrip())
    g.verify()


def test_verify_catches_use_before_definition():
    g, relu, add, exp = small_graph()
    g.nodes = [add, relu, exp]
    with pytest.raises(ValueError, match="used before it is defined"):
        g.verify()


def test_verify_catches_double_definition():
    g, relu, _add, _ = small_graph()
    dup = Node("Neg", [g.values["x"]], [relu.outputs[0]], name="dup")
    g.values["x"].uses.append((dup, 0))
    g.nodes.insert(1, dup)
    with pytest.raises(ValueError, match="defined twice"):
        g.verify()


def test_verify_catches_undefined_output_and_missing_link():
    g, relu, _add, _exp = small_graph()
    g.outputs.append(Value("ghost"))
    with pytest.raises(ValueError, match="graph output 'ghost' is never defined"):
        g.verify()
    g, relu, _add, _exp = small_graph()
    relu.outputs[0].uses.clear()
    with pytest.raises(ValueError, match="use-def link missing"):
        g.verify()


def test_topo_sort_is_stable_and_finds_cycles():
    g, relu, add, exp = small_graph()
    g.nodes = [exp, relu, add]
    g.topo_sort()
    assert [n.name for n in g.nodes] == ["relu", "add", "exp"]
    # a cycle: relu reads exp's output
    relu.inputs[0] = exp.outputs[0]
    exp.outputs[0].uses.append((relu, 0))
    with pytest.raises(ValueError, match="cycle"):
        g.topo_sort()


def test_replace_all_uses_and_remove_node():
    g, relu, add, _exp = small_graph()
    x = g.values["x"]
    with pytest.raises(ValueError, match="still used"):
        g.remove_node(relu)
    g.replace_all_uses(relu.outputs[0], x)
    assert add.inputs[0] is x and (add, 0) in x.uses
    g.remove_node(relu)
    g.replace_all_uses(x, x)  # a no-op, not an endless loop
    g.verify()
    assert [n.name for n in g.nodes] == ["add", "exp"]


def test_extract_makes_a_standalone_graph():
    g, relu, add, exp = small_graph()
    sub = g.extract([add, exp], name="tail")
    assert [v.name for v in sub.inputs] == [relu.outputs[0].name]
    assert list(sub.initializers) == ["w"]  # constants travel as initializers
    assert [v.name for v in sub.outputs] == [exp.outputs[0].name]
    sub.verify()
    # values are copies: editing the subgraph leaves the graph alone
    sub.values["w"].shape = (99,)
    assert g.values["w"].shape == (3,)
    head = g.extract([relu], name="head")
    assert [v.name for v in head.outputs] == [relu.outputs[0].name]
    with pytest.raises(ValueError, match="not in graph"):
        g.extract([Node("Neg", [], [Value("z")], name="stranger")])


def test_extract_keeps_values_read_outside_as_outputs():
    g, relu, add, _exp = small_graph()
    extra = g.make_node("Neg", [relu.outputs[0]], name="neg")
    g.outputs.append(extra.outputs[0])
    sub = g.extract([relu, add])
    assert {v.name for v in sub.outputs} == {relu.outputs[0].name, add.outputs[0].name}

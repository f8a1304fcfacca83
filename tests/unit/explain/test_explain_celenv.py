"""CEL selectors give kube-scheduler's answer: one case per row of the design's CEL tables, so
that an upgrade of the CEL binding shows at once what changed."""

from typing import Any

import pytest
from neuron_dra_common.explain.celenv import (
    CannotEvaluate,
    CelError,
    DeviceValue,
    DraCel,
    device_value,
)

DRIVER = "neuron.aws.com"


@pytest.fixture(scope="module")
def cel_env() -> DraCel:
    return DraCel()


def chip(**extra_attributes: Any) -> DeviceValue:
    attributes: dict[str, Any] = {
        "instanceType": {"string": "trn2.48xlarge"},
        "deviceId": {"int": 3},
        "healthy": {"bool": True},
        "resource.aws.com/devicegroup4_id": {"string": "9f2c0a11d2e4b7aa"},
        **extra_attributes,
    }
    return device_value(
        driver=DRIVER,
        device={
            "name": "neurondevice3",
            "attributes": attributes,
            "capacity": {"memory": {"value": "96Gi"}},
        },
    )


def answer(cel_env: DraCel, expression: str, device: DeviceValue | None = None) -> object:
    program = cel_env.compile(expression)
    if isinstance(program, CannotEvaluate):
        return program
    return cel_env.matches(program, device or chip(driverVersion={"version": "2.24.7"}))


@pytest.mark.parametrize(
    ("expression", "expected"),
    [
        ("device.driver == 'neuron.aws.com'", True),
        ("device.attributes['neuron.aws.com'].instanceType == 'trn2.48xlarge'", True),
        ("device.attributes['resource.aws.com'].devicegroup4_id == '9f2c0a11d2e4b7aa'", True),
        (
            "device.attributes['neuron.aws.com'].deviceId < 8 && device.attributes['neuron.aws.com'].healthy",
            True,
        ),
        ("device.attributes['neuron.aws.com'].driverVersion.compareTo(semver('1.2.3')) >= 0", True),
        (
            "device.attributes['neuron.aws.com'].driverVersion.isGreaterThan(semver('2.25.0'))",
            False,
        ),
        ("device.capacity['neuron.aws.com'].memory.compareTo(quantity('64Gi')) >= 0", True),
        ("device.allowMultipleAllocations == false", True),
        ("cel.bind(n, device.attributes['neuron.aws.com'], n.deviceId == 3)", True),
        ("device.attributes['neuron.aws.com'].instanceType.lowerAscii().startsWith('trn2')", True),
        ("semver('1.0.0') == semver('1.0.0')", True),
        ("device.attributes['neuron.aws.com'].instanceType == 1", False),
        ("[1,2].exists(x, x == 2) && 'a' in ['a']", True),
        ("device.attributes['neuron.aws.com'].?missing.orValue('d') == 'd'", True),
        ("'a,b'.split(',') == ['a','b']", True),
        ("'x%sy'.format(['1']) == 'x1y'", True),
        ("['a','b'].join('-') == 'a-b'", True),
        ("'abc'.matches('^a')", True),
        ("sets.contains([1,2,3], [2])", True),
        ("sets.equivalent([1,2], [2,1]) && sets.intersects([1], [1,3])", True),
        ("[1,2,3].isSorted() && [1,2].sum() == 3 && [3,1].min() == 1 && [3,1].max() == 3", True),
        ("'trn2.48xlarge'.find('[0-9]+') == '2'", True),
        ("'a1b22'.findAll('[0-9]+') == ['1', '22']", True),
        ("device.attributes['neuron.aws.com'].deviceId < 4.5", True),
        ("device.attributes['neuron.aws.com'].deviceId == 3.0", True),
        ("device.attributes['neuron.aws.com'].deviceId > 2u", True),
        ("has(device.attributes['other.io'].x)", False),
        ("has(device.attributes['neuron.aws.com'].driverVersion)", True),
        ("has(device.attributes['neuron.aws.com'].nope)", False),
        ("quantity('1Gi') == quantity('1024Mi')", True),
        ("quantity('1500m').isInteger() || quantity('1500m').sign() != 1", False),
        ("quantity('1Gi').add(1).asInteger() == 1073741825", True),
        ("quantity('1Gi').sub(quantity('512Mi')).asApproximateFloat() == 536870912.0", True),
        ("isQuantity('96Gi') && !isQuantity('96 Gi')", True),
        ("semver('1.0.0+build') == semver('1.0.0')", True),
        ("semver('1.0.0-alpha').isLessThan(semver('1.0.0'))", True),
        ("semver('v1.2', true).compareTo(semver('1.2.0')) == 0", True),
        ("isSemver('v1', true) && !isSemver('v1')", True),
        (
            "semver('2.24.7').major() == 2 && semver('2.24.7').minor() == 24 && semver('2.24.7').patch() == 7",
            True,
        ),
    ],
)
def test_selector_answers_as_kube_scheduler(
    cel_env: DraCel, expression: str, expected: bool
) -> None:
    assert answer(cel_env, expression) is expected


@pytest.mark.parametrize(
    ("expression", "message"),
    [
        ("device.attributes['neuron.aws.com'].missing == 'x'", "no such key: missing"),
        ("device.attributes['other.io'].x == 1", "no such key: x"),
        (
            "semver('not-a-version').compareTo(semver('1.0.0')) > 0",
            "No Major.Minor.Patch elements found",
        ),
        (
            "semver('1.0.0').compareTo(quantity('1')) > 0",
            "no such overload: semver.compareTo(quantity)",
        ),
        ("quantity('1500m').asInteger() == 1", "cannot convert value to integer"),
        ("device.attributes['neuron.aws.com'].deviceId", "could not be converted to bool"),
    ],
)
def test_runtime_errors_carry_the_schedulers_meaning(
    cel_env: DraCel, expression: str, message: str
) -> None:
    result = answer(cel_env, expression)
    assert isinstance(result, CelError)
    assert message in result.message


@pytest.mark.parametrize(
    ("expression", "why"),
    [
        ("[1,2].all(i, v, v > i)", "two-variable comprehensions (all)"),
        (
            "[1,2].transformList(i, v, v * 2) == [2,4]",
            "two-variable comprehensions (transformList)",
        ),
        ("[3,1].sort() == [1,3]", "lacks sort"),
        ("ip('10.0.0.1').family() == 4", "lacks ip"),
        ("1 < 1.5", "checker rejects it"),
        ("[1].indexOf(1) == 0", "checker rejects it"),
        (
            "'neuron.aws.com' in device.attributes",
            "device.attributes other than with a literal domain",
        ),
        (
            "device.attributes.exists(d, d == 'x')",
            "device.attributes other than with a literal domain",
        ),
        ("cel.bind(d, 'neuron.aws.com', device.capacity[d].memory.sign() == 1)", "device.capacity"),
        (
            "device.attributes['neuron.aws.com'].driverVersion == '2.24.7'",
            "version attribute driverVersion",
        ),
    ],
)
def test_what_cel_cpp_answers_differently_is_cannot_evaluate(
    cel_env: DraCel, expression: str, why: str
) -> None:
    result = answer(cel_env, expression)
    assert isinstance(result, CannotEvaluate)
    assert why in result.why


def test_unparsable_version_attribute_fails_every_selector_of_that_device(cel_env: DraCel) -> None:
    device = chip(driverVersion={"version": "2.24"})
    result = answer(cel_env, "device.driver == 'neuron.aws.com'", device)
    assert result == CelError(
        "attribute driverVersion: parse semantic version: No Major.Minor.Patch elements found"
    )


def test_list_typed_attribute_is_the_schedulers_unsupported_value(cel_env: DraCel) -> None:
    device = chip(links={"intValues": [1, 2]})
    result = answer(cel_env, "device.driver == 'neuron.aws.com'", device)
    assert result == CelError("attribute links: unsupported attribute value")


def test_devices_with_the_same_content_share_one_evaluation(cel_env: DraCel) -> None:
    a, b = chip(), chip()
    c = chip(deviceId={"int": 4})
    assert a.fingerprint == b.fingerprint != c.fingerprint

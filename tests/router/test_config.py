"""fd-router's flags: FastDeploy's names, bad values refused by name."""

from __future__ import annotations

import pytest

from fd_core.router.app import instance_url_of
from fd_core.router.config import RouterConfig, build_parser, config_from, normalize_url


def test_fastdeploy_flags_parse():
    ns = build_parser().parse_args(["--port", "9100", "--splitwise", "--request-timeout-secs", "60",
                                    "--prefill-policy", "cache_aware", "--decode-policy", "power_of_two",
                                    "--instances", "127.0.0.1:8001", "http://h:8002/"])
    config = config_from(ns)
    assert config.port == 9100 and config.splitwise and config.request_timeout_secs == 60
    assert config.instances == ("http://127.0.0.1:8001", "http://h:8002")
    assert config.decode_policy == "power_of_two"


def test_an_unknown_flag_is_refused_by_name(capsys):
    with pytest.raises(SystemExit) as exc:
        build_parser().parse_args(["--polcy", "round_robin"])
    assert exc.value.code == 2
    assert "--polcy" in capsys.readouterr().err


@pytest.mark.parametrize("url", ["", "http://host", "ftp://h:1", "http://h:1/v1", "h:notaport", "http://:80"])
def test_a_bad_instance_url_is_refused_by_name(url):
    with pytest.raises(ValueError, match="--instances URL") as exc:
        RouterConfig(instances=(url,))
    assert repr(url) in str(exc.value)


def test_urls_are_normalized():
    assert normalize_url("localhost:80") == "http://localhost:80"
    assert normalize_url("https://[::1]:8443/") == "https://[::1]:8443"


@pytest.mark.parametrize("kw, flag", [
    ({"policy": "fastest"}, "--policy"), ({"decode_policy": "x"}, "--decode-policy"),
    ({"health_check_interval_secs": 0}, "--health-check-interval-secs"),
    ({"health_failure_threshold": 0}, "--health-failure-threshold"),
    ({"max_attempts": 0}, "--max-attempts"), ({"port": 70000}, "--port"),
    ({"balance_rel_threshold": -1}, "--balance-rel-threshold"), ({"scheduler_host": " "}, "--scheduler-host"),
])
def test_bad_values_name_their_flag(kw, flag):
    with pytest.raises(ValueError, match=flag):
        RouterConfig(**kw)


def test_the_cli_reports_a_bad_value_and_exits_2(capsys):
    from fd_core.router.cli import main

    assert main(["--instances", "nonsense"]) == 2
    assert "'nonsense'" in capsys.readouterr().err


def test_register_bodies():
    assert instance_url_of({"role": "PREFILL", "host_ip": "10.0.0.1", "port": 31000}) == \
        ("http://10.0.0.1:31000", "prefill")
    assert instance_url_of({"url": "h:1"}) == ("http://h:1", "mixed")
    with pytest.raises(ValueError, match="'leader'"):
        instance_url_of({"role": "leader", "url": "h:1"})
    with pytest.raises(ValueError, match="host_ip and port"):
        instance_url_of({"role": "mixed", "host_ip": "h"})


def test_the_router_runs_without_paddle():
    import subprocess
    import sys

    script = ("import sys; sys.modules['paddle'] = None\n"
              "from fd_core.router.app import build_app\nfrom fd_core.router.cli import main\n"
              "from fd_core.router.config import RouterConfig\nimport fd_core.router.announce\n"
              "build_app(RouterConfig(instances=('h:1',), scheduler_host='127.0.0.1'))\n"
              "loaded = [m for m, v in sys.modules.items() if v is not None\n"
              "          and m.startswith(('paddle', 'numpy', 'fd_core.engine'))]\n"
              "assert not loaded, loaded\n"
              "print('ok')")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr

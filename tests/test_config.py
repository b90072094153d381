"""Tests of scheduler_ext.config: one frozen, validated configuration built from settings."""

from __future__ import annotations

import dataclasses

import pytest
from scrapy.settings import Settings

from scheduler_ext.config import Config, backoff
from scheduler_ext.exceptions import ConfigurationError
from scheduler_ext.scheduler import Pace


def test_defaults_give_the_papers_minute_to_every_role_of_the_old_threshold() -> None:
    c = Config.from_settings(Settings())
    assert (c.recall_age, c.lease_ttl, c.node_timeout) == (60.0, 60.0, 60.0)
    assert c.recall_threshold == c.recall_age


def test_recall_threshold_still_sets_the_recall_age_and_what_defaults_to_it() -> None:
    c = Config.from_settings(Settings({"SCHEDEXT_RECALL_THRESHOLD": "4", "SCHEDEXT_HEARTBEAT_INTERVAL": 0.5}))
    assert (c.recall_age, c.lease_ttl, c.node_timeout) == (4.0, 4.0, 4.0)


def test_each_role_has_its_own_setting() -> None:
    c = Config.from_settings(Settings({"SCHEDEXT_RECALL_THRESHOLD": 50, "SCHEDEXT_RECALL_AGE": 60,
                                       "SCHEDEXT_LEASE_TTL": 20, "SCHEDEXT_NODE_TIMEOUT": 15}))
    assert (c.recall_age, c.lease_ttl, c.node_timeout) == (60.0, 20.0, 15.0)


def test_config_is_frozen() -> None:
    c = Config.from_settings(Settings())
    with pytest.raises(dataclasses.FrozenInstanceError):
        c.tick_batch = 3  # type: ignore[misc]


@pytest.mark.parametrize(("name", "value", "expected"), [
    ("SCHEDEXT_TICK_INTERVAL", "soon", "SCHEDEXT_TICK_INTERVAL: expected a number > 0 and <= 604800, got 'soon'"),
    ("SCHEDEXT_TICK_INTERVAL", 0, "SCHEDEXT_TICK_INTERVAL: expected a number > 0"),
    ("SCHEDEXT_PREFETCH", -1, "SCHEDEXT_PREFETCH: expected an integer >= 0, got -1"),
    ("SCHEDEXT_EXPLORE_PAGES", 2.5, "SCHEDEXT_EXPLORE_PAGES: expected an integer >= 0"),
    ("SCHEDEXT_EXPLORE_PAGES", -3, "SCHEDEXT_EXPLORE_PAGES: expected an integer >= 0, got -3"),
    ("SCHEDEXT_TICK_BATCH", "1.5", "SCHEDEXT_TICK_BATCH: expected an integer >= 1"),
    ("SCHEDEXT_TASK_LANES", 0, "SCHEDEXT_TASK_LANES: expected an integer >= 1, got 0"),
    ("SCHEDEXT_RETRY_BACKOFF", -1, "SCHEDEXT_RETRY_BACKOFF: expected a number >= 0 and <= 604800, got -1"),
    ("SCHEDEXT_RATE_FLOOR", 1.5, "SCHEDEXT_RATE_FLOOR: expected a number >= 0 and <= 1, got 1.5"),
    ("SCHEDEXT_RATE_FLOOR", "high", "SCHEDEXT_RATE_FLOOR: expected a number >= 0 and <= 1, got 'high'"),
    ("SCHEDEXT_ESTIMATE_ALPHA", 2, "SCHEDEXT_ESTIMATE_ALPHA: expected a number > 0 and <= 1"),
    ("SCHEDEXT_NODE_ID", "a|b", "SCHEDEXT_NODE_ID: must not contain '|'"),
    ("SCHEDEXT_NODE_TYPE", "x", "SCHEDEXT_NODE_TYPE: expected 0, 1 or 0,1"),
    ("SCHEDEXT_CONTROL_ENABLED", "maybe", "SCHEDEXT_CONTROL_ENABLED: expected a boolean"),
    ("SCHEDEXT_LEASE_TTL", 2, "SCHEDEXT_LEASE_TTL: expected more than SCHEDEXT_HEARTBEAT_INTERVAL"),
    ("SCHEDEXT_PAGE_LIMIT_MIN", 50, "SCHEDEXT_PAGE_LIMIT_MIN: expected at most SCHEDEXT_PAGE_LIMIT_MAX"),
    # no setting means "never" by an infinity, and a duration past a week is one by accident
    ("SCHEDEXT_RECALL_THRESHOLD", "inf", "SCHEDEXT_RECALL_THRESHOLD: expected a number > 0 and <= 604800, got 'inf'"),
    ("SCHEDEXT_SITE_RATE", float("inf"), "SCHEDEXT_SITE_RATE: expected a number >= 0, got inf"),
    ("SCHEDEXT_TICK_INTERVAL", "1e300", "SCHEDEXT_TICK_INTERVAL: expected a number > 0 and <= 604800"),
    ("SCHEDEXT_IDLE_CLOSE", 604801, "SCHEDEXT_IDLE_CLOSE: expected a number >= 0 and <= 604800, got 604801"),
    ("SCHEDEXT_EXPLORE_PAGES", "inf", "SCHEDEXT_EXPLORE_PAGES: expected an integer >= 0, got 'inf'"),
    # int() and float() read other scripts' digits ('١٢' is 12, '²' too for some): only 0-9
    ("SCHEDEXT_PAGE_LIMIT", "١٢", "SCHEDEXT_PAGE_LIMIT: expected an integer >= 1, got '١٢'"),
    ("SCHEDEXT_TICK_INTERVAL", "５", "SCHEDEXT_TICK_INTERVAL: expected a number > 0 and <= 604800, got '５'"),
])
def test_a_bad_value_names_the_setting_and_what_was_expected(name: str, value: object, expected: str) -> None:
    with pytest.raises(ConfigurationError) as err:
        Config.from_settings(Settings({name: value}))
    assert str(err.value).startswith(expected)


def test_backoff_doubles_up_to_its_cap() -> None:
    assert [backoff(n, 1.0, 5.0) for n in range(5)] == [0.0, 1.0, 2.0, 4.0, 5.0]


def test_config_and_pace_doctests() -> None:  # ready_pages, and a node's Pace under a DOWNLOAD_DELAY
    import doctest

    from scheduler_ext import config, scheduler

    for module in (config, scheduler):
        result = doctest.testmod(module)
        assert result.attempted > 0 and result.failed == 0, module.__name__


def test_the_exploration_size_has_one_default() -> None:
    # The setting's default, the config's and the bandit's are the change-point minimum (strategies.md, step 5).
    from scheduler_ext.defaults import DEFAULTS
    from scheduler_ext.strategies.bandit import EXPLORE_PAGES
    from scheduler_ext.strategies.posterior import CHANGE_PAGES

    assert DEFAULTS["SCHEDEXT_EXPLORE_PAGES"] == Config().explore_pages == EXPLORE_PAGES == CHANGE_PAGES


@pytest.mark.parametrize(("name", "value", "expected"), [
    ("DOWNLOAD_DELAY", "nan", "DOWNLOAD_DELAY: expected a number >= 0 and <= 604800, got 'nan'"),
    ("DOWNLOAD_DELAY", "-1", "DOWNLOAD_DELAY: expected a number >= 0 and <= 604800, got '-1'"),
    ("CONCURRENT_REQUESTS", "0", "CONCURRENT_REQUESTS: expected an integer >= 1, got '0'"),
])
def test_a_node_names_a_bad_scrapy_setting_it_paces_by(name: str, value: str, expected: str) -> None:
    # Before: DOWNLOAD_DELAY nan failed the node's start with "cannot convert float NaN to integer"
    with pytest.raises(ConfigurationError) as err:
        Pace.from_config(Config(), Settings({name: value}))
    assert str(err.value) == expected


def test_a_polite_pace_lengthens_what_a_subtask_lives_by_not_the_lease() -> None:
    # 2 x time safety x page limit x DOWNLOAD_DELAY: at 30 s a page, a minute gave one-page subtasks cut by their
    # own time limit (scheduler_ext.config.paced_floor; the simulated consequence in test_sim.py)
    c = Config.from_settings(Settings({"DOWNLOAD_DELAY": 30}))
    assert (c.recall_age, c.patience, c.time_limit_max) == (600.0, 300.0, 300.0)
    assert (c.lease_ttl, c.node_timeout) == (60.0, 60.0)  # renewed by heartbeats, whatever the pace
    polite = Config.from_settings(Settings({"DOWNLOAD_DELAY": 2}))  # under 3 s with the defaults: as before
    assert (polite.recall_age, polite.patience, polite.time_limit_max) == (60.0, 30.0, 120.0)
    longer = Config.from_settings(Settings({"DOWNLOAD_DELAY": 30, "SCHEDEXT_RECALL_THRESHOLD": 1200,
                                            "SCHEDEXT_PAGE_LIMIT": 2}))
    assert (longer.recall_age, longer.patience, longer.time_limit_max) == (1200.0, 120.0, 120.0)
    for bad in ("slow", "604801", "nan"):  # as the node's own check (Pace): a number, at most a week
        with pytest.raises(ConfigurationError) as err:
            Config.from_settings(Settings({"DOWNLOAD_DELAY": bad}))
        assert str(err.value) == f"DOWNLOAD_DELAY: expected a number >= 0 and <= 604800, got {bad!r}"

"""The catalogue of studies (``studies.catalog``): every name it reads across studies exists, so that a report never
looks for an arm or a study that is not there."""

from studies import catalog
from studies.results import second_evaluations


def test_every_study_has_its_folders_sizes_and_a_goal_where_named():
    assert set(catalog.COMPARED) == set(catalog.STUDIES) and catalog.HEADLINE in catalog.STUDIES
    assert set(catalog.SIZES) == set(catalog.STUDIES)
    for table in (catalog.GOALS, catalog.LATER, catalog.CONTROLS, catalog.PAIRS, catalog.REPRODUCES,
                  catalog.SECOND_EVAL, catalog.EVAL_OPTIONS):
        assert set(table) <= set(catalog.STUDIES)
    for study, arms in catalog.LATER.items():
        assert set(arms) <= set(catalog.STUDIES[study][3])


def test_controls_pairs_and_reproductions_name_arms_that_exist():
    arms = {study: entry[3] for study, entry in catalog.STUDIES.items()}
    for study, controls in catalog.CONTROLS.items():
        for _, source, arm in controls:
            assert arm in arms[source] and arms[source][arm][1] is None, f"{study}'s control {source}/{arm}: an APE arm"
    for study, pairs in catalog.PAIRS.items():
        for arm, source, theirs in pairs:
            assert arm in arms[study] and theirs in arms[source], (study, arm, source, theirs)
    for study, (source, reproduced) in catalog.REPRODUCES.items():
        assert set(reproduced) <= set(arms[study]) & set(arms[source])


def test_every_second_evaluation_is_one_the_reports_read_and_title(tmp_path):
    folders = {folder for folder, _ in catalog.SECOND_EVAL.values()}
    for folder in folders:
        (tmp_path / folder).mkdir()
    (tmp_path / "eval").mkdir()  # the main evaluation is not a second one
    titled = dict(second_evaluations(tmp_path))
    assert {path.name for path in titled} == folders
    assert titled[tmp_path / "eval_crop0.875"] == "At crop 0.875"
    assert titled[tmp_path / "eval_windows_keep"] == "Windows `--window-size keep`"

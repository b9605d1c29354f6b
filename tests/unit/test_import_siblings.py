"""A module deployed from the current directory travels to the cluster by value, and so do the modules
beside it that its import imported (``api.apps.import_app``, ``_siblings``): a replica's process
may not have that folder on its path. No Ray: what is registered with cloudpickle is read back."""

from __future__ import annotations

import sys

from ray import cloudpickle

from executors.ray_gpu.api.apps import import_app


def test_a_sibling_the_app_module_imports_goes_by_value_with_it(tmp_path, monkeypatch):
    (tmp_path / "sib_utils_x1.py").write_text("def hello():\n    return 'hello_from_utils'\n")
    (tmp_path / "sib_app_x1.py").write_text(
        "import sib_utils_x1\nimport json\nfrom executors.ray_gpu import serve\n\n\n"
        "@serve.deployment(name='SibApp')\nclass SibApp:\n    def __call__(self, *args):\n"
        "        return sib_utils_x1.hello()\n\n\napp = SibApp.bind()\n")
    monkeypatch.chdir(tmp_path)
    try:
        app = import_app("sib_app_x1:app", {})
        registered = cloudpickle.list_registry_pickle_by_value()
        assert app.deployment.name == "SibApp"
        assert {"sib_app_x1", "sib_utils_x1"} <= registered and "json" not in registered
        copy = cloudpickle.loads(cloudpickle.dumps(app.deployment.cls))  # (by value: its sibling's code with it)
        assert copy()() == "hello_from_utils"
    finally:
        for name in ("sib_app_x1", "sib_utils_x1"):
            if name in cloudpickle.list_registry_pickle_by_value():
                cloudpickle.unregister_pickle_by_value(sys.modules[name])
            sys.modules.pop(name, None)
        while str(tmp_path) in sys.path:
            sys.path.remove(str(tmp_path))

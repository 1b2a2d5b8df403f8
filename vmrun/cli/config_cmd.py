"""`vmrun config`: every setting, its value, and the layer it came from."""

from __future__ import annotations

import typer

from vmrun.cli.output import say


def register(app: typer.Typer) -> None:
    @app.command("config", help="Show the resolved settings and where each one came from.")
    def config_command() -> int:
        """Prints valid TOML (values as TOML writes them, the rest comments), so any line
        can be pasted into vmrun.toml or the user config."""
        from pathlib import Path

        import tomlkit

        from vmrun.config import FIELDS, load_settings, user_config_path

        settings = load_settings()
        say("# defaults < user config < project vmrun.toml < VMRUN_* < flags")
        say(f"# user config: {user_config_path()}")
        project = settings.project_dir / "vmrun.toml" if settings.project_dir else "(none)"
        say(f"# project file: {project}")
        for name, fld in FIELDS.items():
            value = getattr(settings, name)
            if name == "notify":  # the URLs hold tokens: shown as scheme and host only
                from vmrun.notify.targets import redact

                value = [redact(url) for url in value]
            shown = tomlkit.item(str(value) if isinstance(value, Path) else value).as_string()
            say(f"{name} = {shown}    # {settings.sources[name]}; env {fld.env}; {fld.doc}")
        return 0

"""What the rows of every table share: a row's own settings (``Setting``) and the schema the rows
of a table add to config (``row_settings``)."""
from dataclasses import dataclass


@dataclass(frozen=True)
class Setting:
    """A row's own setting: its default and its numbers' interval, as config.RANGES writes them."""
    default: object
    interval: str = None


def row_settings(table, rows):
    """{name: Setting} of the settings of a table's ``rows`` ({row: {name: Setting}}). A name means
    one thing, so rows that share one share its Setting (a ValueError says which)."""
    found = {}
    for row_name, settings in rows.items():
        for name, setting in settings.items():
            if found.setdefault(name, setting) != setting:
                raise ValueError(f"{table}: '{name}' of '{row_name}' is {setting}, another row's is "
                                 f"{found[name]}; a setting means one thing: give the same, or another name")
    return found

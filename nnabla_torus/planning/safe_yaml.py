"""The one YAML reader of the package's user files (recipes, cluster profiles): yaml.safe_load
without aliases.

An alias (``*name``) repeats an anchored node (``&name``) by reference, so a few hundred bytes
of nested aliases stand for a value of billions of items: a 235-byte recipe of 7 levels took
510 MB and printed a 28 MB error line once its value was turned into text. No recipe or
profile needs one; each is refused at its line. Example::

    load("epochs: 12\\n")              # {"epochs": 12}
    load("a: &x [1]\\nb: *x\\n")       # yaml.YAMLError: alias *x: ... line 2, column 4
"""
import yaml


class NoAliasLoader(yaml.SafeLoader):
    """yaml.SafeLoader that raises a ComposerError at the first alias, with its line."""

    def compose_node(self, parent, index):
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()
            raise yaml.composer.ComposerError(
                None, None, f"alias *{event.anchor}: aliases are not accepted, write each "
                            f"value out", event.start_mark)
        return super().compose_node(parent, index)


def load(stream):
    """The value of YAML ``stream`` (text or a file object), as yaml.safe_load gives it; an
    alias raises yaml.YAMLError naming its line (callers turn it into their one line)."""
    return yaml.load(stream, Loader=NoAliasLoader)

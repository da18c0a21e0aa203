"""Demo tabs, one per pipeline kind (image, text, world = next-frame video). A new pipeline family adds its module
here and one entry to `TABS`; `build_demo` and the other tabs stay as they are."""

from apps.tabs.base import Tab
from apps.tabs.image import ImageTab
from apps.tabs.text import TextTab
from apps.tabs.world import WorldTab

TABS: dict[str, type[Tab]] = {"image": ImageTab, "text": TextTab, "world": WorldTab}

__all__ = ["TABS", "ImageTab", "Tab", "TextTab", "WorldTab"]

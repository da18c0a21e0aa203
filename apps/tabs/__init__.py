"""Demo tabs, one per pipeline kind (image, text, world = next-frame video). A new pipeline family adds its module
here and one entry to `TABS`; `build_demo` and the other tabs stay as they are."""

from mmspec.apps.tabs.base import Tab
from mmspec.apps.tabs.image import ImageTab
from mmspec.apps.tabs.text import TextTab
from mmspec.apps.tabs.world import WorldTab

TABS: dict[str, type[Tab]] = {"image": ImageTab, "text": TextTab, "world": WorldTab}

__all__ = ["TABS", "ImageTab", "Tab", "TextTab", "WorldTab"]

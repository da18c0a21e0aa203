"""The drafting algorithms every modality shares, apart from the kernel they draft for (`mmspec.core`): a draft
model's chains, trees and cascades (`proposer`), a feature head's (`heads`), tree growth (`tree_growth`), when a row
stops drafting (`stops`), how many tokens it drafts (`lengths`) and a trimmed draft vocabulary (`vocabulary`). The
round that verifies their drafts is the kernel's, `mmspec.core.speculation`."""

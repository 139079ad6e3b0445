"""Chapter 04's reference answers (read only by its solution cells; see README.md here)."""


def exact_accuracy(per_rank):
    """per_rank[r]: the (dataset index, correct) pairs rank r evaluated, padding included. Each sample counts once."""
    votes = {index: correct for pairs in per_rank for index, correct in pairs}  # a padded duplicate overwrites itself
    return sum(votes.values()) / len(votes)

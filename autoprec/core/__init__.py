"""The plain data every layer shares: the plan, the search space, errors, atomic files, escaping."""

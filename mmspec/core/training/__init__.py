"""Training code the zoo and the online learners share (`heads`: a draft head's teacher-forced predictions)."""

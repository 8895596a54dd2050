# gbm: stochastic gradient boosting (bernoulli, 80 trees of depth 3, bag fraction 0.5) of 12 predictors + a factor taken from an 80,000 x 40 data frame (~26 MB), then predict() on an 80,000-row test frame; exercises model-frame extraction and data-frame-to-matrix copies, per-iteration residual/prediction vectors and predict's model-frame copies.
suppressMessages(library(gbm))
set.seed(2506)
mk <- function(n, p) {
  d <- as.data.frame(matrix(rnorm(n * p), n, p))
  d$grp <- factor(sample(letters[1:6], n, replace = TRUE))
  eta <- d$V1 - 0.8 * d$V2 + 0.6 * d$V3 * d$V4 + ifelse(d$grp %in% c("a", "d"), 0.7, -0.3) + sin(2 * d$V5)
  d$y <- rbinom(n, 1, plogis(eta))
  d
}
train <- mk(80000, 40)
test <- mk(80000, 40)
form <- as.formula(paste("y ~", paste(paste0("V", 1:12), collapse = " + "), "+ grp"))
fit <- gbm(form, data = train, distribution = "bernoulli", n.trees = 80,
           interaction.depth = 3, shrinkage = 0.1, bag.fraction = 0.5, n.cores = 1)
pr <- predict(fit, newdata = test, n.trees = c(40, 80), type = "response")
acc <- colMeans((pr > 0.5) == test$y)
ri <- summary(fit, plotit = FALSE)
cat(sprintf("train deviance %.6f  test acc@40 %.6f acc@80 %.6f\n", fit$train.error[80], acc[1], acc[2]))
cat(sprintf("top vars %s  rel.inf %.4f\n", paste(head(as.character(ri$var), 4), collapse = " "), ri$rel.inf[1]))

# linear discriminant analysis (MASS::lda): 4-class lda on a 150,000 x 50 data frame (~60 MB) via the formula interface, predict() on a 100,000-row test frame, and a refit on a user-modified copy of the frame; exercises model-frame/model-matrix copies, group-centred matrix copies inside lda and copy-on-modify of data-frame columns.
suppressMessages(library(MASS))
set.seed(2508)
p <- 50
mu <- matrix(rnorm(4 * p, sd = 0.3), 4, p)
mk <- function(n) {
  g <- sample(1:4, n, replace = TRUE)
  d <- as.data.frame(matrix(rnorm(n * p), n, p) + mu[g, ])
  d$V2 <- d$V2 + 0.5 * d$V1
  d$class <- factor(c("w", "x", "y", "z")[g])
  d
}
train <- mk(150000)
test <- mk(100000)
fit <- lda(class ~ ., data = train)
pr <- predict(fit, newdata = test)
acc <- mean(pr$class == test$class)

# the user standardises some columns on a copy and refits with fewer predictors
train2 <- train
train2[paste0("V", 1:10)] <- lapply(train2[paste0("V", 1:10)], function(v) (v - mean(v)) / sd(v))
fit2 <- lda(class ~ . - V49 - V50, data = train2, prior = rep(0.25, 4))
cat(sprintf("lda: acc %.6f  svd %s\n", acc, paste(sprintf("%.6f", fit$svd), collapse = " ")))
cat(sprintf("lda2: scaling sum %.6f  means sum %.6f  mean posterior max %.6f\n",
            sum(abs(fit2$scaling)), sum(fit2$means), mean(apply(pr$posterior, 1, max))))

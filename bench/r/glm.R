# logistic regression (glm, binomial): a 500,000 x 30 data frame with two factor columns (~120 MB) fitted with the formula interface, a nested model compared by anova(), and predict() on a test frame; exercises model-matrix construction, IRLS re-weighting copies of the design matrix on every iteration and the large fitted objects glm keeps (qr, weights, residuals, model frame).
set.seed(2509)
mk <- function(n, p) {
  d <- as.data.frame(matrix(rnorm(n * p), n, p))
  d$region <- factor(sample(c("north", "south", "east", "west"), n, replace = TRUE))
  d$tier <- factor(sample(1:5, n, replace = TRUE))
  eta <- 0.6 * d$V1 - 0.4 * d$V2 + 0.3 * d$V3 * d$V4 + c(north = 0.3, south = -0.2, east = 0, west = 0.1)[as.character(d$region)] + 0.1 * as.integer(d$tier)
  d$y <- rbinom(n, 1, plogis(eta - 0.3))
  d
}
train <- mk(500000, 28)
test <- mk(100000, 28)
full <- glm(y ~ ., data = train, family = binomial)
small <- glm(y ~ V1 + V2 + V3 + region + tier, data = train, family = binomial)
inter <- glm(y ~ V1 + V2 + V3 * V4 + region + tier, data = train, family = binomial)
a <- anova(small, full, test = "Chisq")
p <- predict(inter, newdata = test, type = "response")
cat(sprintf("full: deviance %.4f aic %.4f iter %d sumcoef %.6f\n", deviance(full), AIC(full), full$iter, sum(coef(full))))
cat(sprintf("anova: dev diff %.4f p %.6f  inter: coef %.6f  test acc %.6f\n",
            a$Deviance[2], a[["Pr(>Chi)"]][2], coef(inter)[["V3:V4"]], mean((p > 0.5) == test$y)))
